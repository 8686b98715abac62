"""A written-out pass over prompt tokens that continue a prompt (chunked prefill, filling.py):
a chunk alone (`extend`), or chunks of several prompts riding along a decode step, each
attending over its own prompt's keys up to its own position (`chunks_attention`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from . import windowed
from .attention_kernel import AttentionKernel
from .filling import PromptChunk
from .packed_layer import PackedLayer
from .step_stages import Stages

Attend = Callable[[int, PackedLayer, torch.Tensor], torch.Tensor]


def last_rows(chunks: Sequence[PromptChunk]) -> list[int]:
    """Where each chunk that ends its prompt has its last token, among the chunks' tokens laid
    one after another: the rows whose logits are wanted, in the chunks' order."""
    rows, at = [], 0
    for chunk in chunks:
        at += int(chunk.ids.shape[0])
        if chunk.last:
            rows.append(at - 1)
    return rows


class ChunkStages(Stages):
    """`Stages` with the passes that chunks of prompts take."""

    _attention_kernel: AttentionKernel | None

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # DecodeStep's

    @torch.inference_mode()
    def extend(self, chunk: PromptChunk) -> torch.Tensor:
        """A prompt's chunk alone (no decode rows): the logits [1, vocab] of its last position."""
        self._rope_table(chunk.end)
        x = self._layers(chunk.ids, lambda index, _, qkv: self.chunk_attention(qkv, chunk, index))
        return self._logits(x[-1:])

    def _layers(self, ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        """The final norm's output for tokens `ids`, `attend` giving each layer's attention
        output from its q/k/v product."""
        hidden = self.embedding(ids)
        normed = torch.empty_like(hidden)  # each norm's output, read by the product after it
        hidden, x = self.add_norm(hidden, None, self.layers[0].input_norm, normed)
        for index, (layer, norm) in enumerate(zip(self.layers, self.next_norms(), strict=True)):
            attended = attend(index, layer, layer.qkv(x))
            hidden, x = self.after_attention(layer, hidden, attended, norm, normed)
        return x

    def chunks_attention(self, qkv: torch.Tensor, chunks: Sequence[PromptChunk],
                         index: int) -> list[torch.Tensor]:  # fmt: skip
        """Layer `index`'s attention for `chunks`, whose q/k/v products are `qkv`'s rows one
        after another: each chunk's [tokens, heads × dim]."""
        out, at = [], 0
        for chunk in chunks:
            tokens = int(chunk.ids.shape[0])
            out.append(self.chunk_attention(qkv[at : at + tokens], chunk, index))
            at += tokens
        return out

    def chunk_attention(self, qkv: torch.Tensor, chunk: PromptChunk, index: int) -> torch.Tensor:
        """Layer `index`'s attention for a prompt's chunk ([tokens, width] of its q/k/v
        product): its keys and values written into the chunk's buffers, each query over the
        prompt's keys up to its own: [tokens, heads × dim]."""
        tokens, start, end = qkv.shape[0], chunk.start, chunk.end
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        layer = self.layers[index]
        qk = self.prefill_rope(qkv[None], 1, tokens, index, start)[0]  # [tokens, heads, dim]
        keys, values = chunk.keys[index], chunk.values[index]  # [1, kv heads, prompt, dim]
        keys[0, :, start:end] = qk[:, heads:].transpose(0, 1)
        values[0, :, start:end] = (
            qkv[:, layer.qk_width :].view(tokens, kv_heads, dim).transpose(0, 1)
        )
        query = qk[:, :heads].transpose(0, 1)[None]  # [1, heads, tokens, dim]
        window, softcap = self.family.windows[index], self.family.attention_softcap
        keys, values = keys[:, :, :end], values[:, :, :end]
        if self._attention_kernel is not None:
            return self._attention_kernel.causal(query, keys, values, layer.scaling,
                                                 window=window, softcap=softcap,
                                                 before=start)[0]  # fmt: skip
        allowed = windowed.causal_allowed(end, window)[:, :, start:]
        attended = windowed.attend(query, keys, values, allowed, layer.scaling, softcap)
        return attended[0].transpose(0, 1).reshape(tokens, heads * dim)
