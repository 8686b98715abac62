"""The decode batch: the running sequences and their KV buffers, the prefills that bring requests
into it, and the step that gives each of them its next token.

Prompts that need nothing but their next token are prefilled together (prefill.py), over the
prepacked weights where the model allows (decode_step.py); a lone prompt once, or as twin rows,
where that gives the bits of the model's forward on twin rows (generate()'s reference), else
through that forward, as is a prompt with an adapter or prompt log-probs (docs/cpu-engine.md,
"Exactness, and why"). The decode step runs the written-out step, or the model's forward when a
row has an adapter. Tokens are chosen from float32 logits (batch_choice.py) and leave through
responses.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel

from . import prefill, prompt_logprobs
from .attention import padding_block
from .batch_choice import choose_tokens
from .decode_step import DecodeStep
from .family import unsupported
from .fused_ops import load as load_fused_ops
from .kv_batch import BatchedKVCache, Layers, prefilled_layers
from .lora_layers import LoraRows
from .request import EngineFinish, EngineObserver, EngineRequest, Running
from .responses import Responses
from .sampling import SequenceState
from .words import Decode, WordRules

log = logging.getLogger(__name__)


class RunningBatch:
    """The running sequences, in their KV buffers' row order; `counts` is this iteration's
    prefilled requests and tokens and decoded rows (stats.py)."""

    def __init__(
        self,
        model: PreTrainedModel,
        decode: Decode,
        responses: Responses,
        observer: EngineObserver,
        *,
        lora_rows: LoraRows | None = None,
        kernel_dir: Path | None = None,
    ) -> None:
        self.model = model
        # Decodes batches without adapters instead of the model's forward; the two give the
        # same logits bit for bit (decode_step.py).
        reason = unsupported(model)
        # kernel_dir: where fused_ops.py's library is built (None: the user's cache).
        self.fast_step = DecodeStep(model, load_fused_ops(kernel_dir)) if reason is None else None
        if reason is not None:
            log.warning(
                "decoding with the model's own forward, not the written-out step: %s. It "
                "serves the same answers at about 0.6x the written-out step's tokens/s "
                "(docs/cpu-engine.md, model families)",
                reason,
            )
        # Set before every forward pass: which adapter each row uses (attach_lora's layers).
        self._lora_rows = lora_rows
        self._decode = decode
        self._responses = responses
        self._observer = observer
        self.running: list[Running] = []
        self.kv = self._new_cache()
        self.counts = {"context": 0, "context_tokens": 0, "generation": 0}

    def reserved(self) -> int:
        """Tokens the running requests reserve in the KV cache (prompt + max_tokens each)."""
        return sum(run.request.reserved_tokens for run in self.running)

    def prefill(self, admitted: list[EngineRequest]) -> None:
        """Prefill `admitted` and send their first tokens; those that go on join the batch.
        A failed pass fails its own requests only."""
        shared = [r for r in admitted if prefill.shareable(r.params, r.lora is not None)]
        shared_ids = {id(r) for r in shared}
        runs = [[shared[i] for i in run] for run in prefill.groups([r.prompt for r in shared])]
        runs += [[r] for r in admitted if id(r) not in shared_ids]
        for run in runs:
            try:
                lone = run[0] if len(run) == 1 and id(run[0]) in shared_ids else None
                if len(run) > 1 or (lone is not None and self._lone_exact(lone)):
                    self.prefill_shared(run)
                elif lone is not None and self._twin_exact(lone):
                    self.prefill_shared(run, copies=2)
                else:
                    self._prefill(run[0])
            except Exception as error:
                log.exception("prefill failed")
                for request in run:
                    request.sink.on_error(f"prefill failed: {error}")
                    self._observer.on_finished("error")

    def prefill_shared(self, requests: list[EngineRequest], copies: int = 1) -> None:
        """One pass for these prompts that need nothing but their next token (prefill.py), over
        the prepacked weights where the model has them (decode_step.py). A lone one comes here
        only where that gives `_prefill`'s bits (generate()'s twin reference): once, or as
        twin rows (`copies`), in a half or two thirds of `_prefill`'s time."""
        prompts = [r.prompt for r in requests] * copies
        if self._lora_rows is not None:
            self._lora_rows.use([None] * len(prompts))
        if self.fast_step is not None:
            logits, layers = self.fast_step.prefill(prompts)
        else:
            logits, layers = prefill.prefill_together(self.model, prompts)
        self.counts["context"] += len(requests)
        self.counts["context_tokens"] += sum(len(r.prompt) for r in requests)
        rows = len(requests)  # a twin's copy is left out
        self._start(requests, logits[:rows].float(), layers[:rows])

    def _lone_exact(self, request: EngineRequest) -> bool:
        """Whether a lone prompt's single pass over the prepacked weights gives `_prefill`'s
        bits."""
        return self.fast_step is not None and self.fast_step.lone_exact_for(len(request.prompt))

    def _twin_exact(self, request: EngineRequest) -> bool:
        """Whether a lone prompt's twin pass over the prepacked weights gives `_prefill`'s bits."""
        return self.fast_step is not None and self.fast_step.exact_for(len(request.prompt))

    def _prefill(self, request: EngineRequest) -> None:
        cache = DynamicCache()  # every layer keeps every key: windows are masked (windowed.py)
        # A lone prompt runs as two identical rows, as the twin reference generate() does: the
        # products' sums depend on the number of rows (oneDNN's over 32 rows, MKL's float32 ones
        # of an adapter at some counts), so a 34-token prompt alone rounds otherwise than twice.
        if self._lora_rows is not None:
            self._lora_rows.use([request.lora] * 2)
        output = self.model(
            input_ids=torch.tensor([request.prompt] * 2),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=prompt_logprobs.logits_to_keep(request.params),
        )
        self.counts["context"] += 1
        self.counts["context_tokens"] += len(request.prompt)
        if prompt_logprobs.wanted(request.params):
            prompt_logprobs.send(request.sink, output.logits[0], request.prompt, request.params)
        if request.params.max_tokens == 0:  # prefill only: the prompt scored, nothing generated
            request.sink.on_tokens([], [], EngineFinish.LENGTH)
            self._observer.on_finished(EngineFinish.LENGTH.value)
            return
        own = [(keys[:1], values[:1]) for keys, values in prefilled_layers(cache)]
        self._start([request], output.logits[:1, -1].float(), [own])

    def _start(
        self, requests: list[EngineRequest], logits: torch.Tensor, layers: list[Layers]
    ) -> None:
        """Each request's first token from its row of the prefill's float32 `logits` [rows,
        vocab]; then those that go on join the decode batch. Every first token is sent before
        any keys are copied in: a prompt's copy took a few ms on a busy machine, and the last
        of a wave's first tokens waited for all the others' copies."""
        runs = [
            Running(
                request=request,
                state=SequenceState(
                    params=request.params,
                    prompt=request.prompt,
                    words=WordRules(self._decode, request.stop_words, request.bad_words),
                ),
            )
            for request in requests
        ]
        choices = choose_tokens(logits, [run.state for run in runs])
        running = len(self.running)  # pairs are judged by the batch they join, as it is now
        going = [
            i for i, run in enumerate(runs) if not self._responses.advance(run, choices[i], running)
        ]
        self.kv.add_prefilled(*(layers[i] for i in going))
        self.running.extend(runs[i] for i in going)

    def decode_step(self) -> int:
        """One token for every running sequence; how many ended (they have left the batch)."""
        valid, positions = self.kv.decode_inputs()
        # A lone sequence runs as two identical rows (kv_batch.py says why).
        rows = self.running * (self.kv.shown_rows // len(self.running))
        last = torch.tensor([[run.state.generated[-1]] for run in rows])
        adapters = False
        if self._lora_rows is not None:
            self._lora_rows.use([run.request.lora for run in rows])
            adapters = bool(self._lora_rows.groups)
        if self.fast_step is not None and not adapters:
            kv = self.kv
            step = self.fast_step(
                last[:, 0], positions[:, 0], valid, kv.key_buffers, kv.value_buffers
            )
        else:
            output = self.model(
                input_ids=last,
                attention_mask=valid[:, None, None, :],  # 4-D: taken as it is
                position_ids=positions,
                past_key_values=self.kv.cache,
                use_cache=True,
            )
            step = output.logits[:, -1]
        self.kv.advance()
        running = len(self.running)
        self.counts["generation"] = running
        # A lone sequence's twin row (kv_batch.py) is left out.
        logits = step[:running].float()
        choices = choose_tokens(logits, [run.state for run in self.running])
        keep = [
            i
            for i, (run, choice) in enumerate(zip(self.running, choices, strict=True))
            if not self._responses.advance(run, choice, running)
        ]
        if len(keep) != running:
            self.keep(keep)
        return running - len(keep)

    def keep(self, keep: list[int]) -> None:
        """Only the running rows `keep`: a survivor keeps its row unless that row is past the
        new end, and the last survivors fill the gaps the others left, so the KV cache copies
        only those (kv_batch.py)."""
        kept = set(keep)
        tail = [row for row in keep if row >= len(keep)]
        order = [row if row in kept else tail.pop() for row in range(len(keep))]
        self.running = [self.running[row] for row in order]
        self.kv.keep_rows(order)

    def fail(self, message: str) -> None:
        """Every running request fails with `message`; the batch starts afresh."""
        for run in self.running:
            run.request.sink.on_error(message)
            self._observer.on_finished("error")
        self.running = []
        self.kv = self._new_cache()

    def _new_cache(self) -> BatchedKVCache:
        config = self.model.config
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        # Decided here, at start, rather than inside the first request's prefill (~0.3 s).
        padding_block(self.model.dtype, kv_heads, heads // kv_heads, dim)
        return BatchedKVCache(query_groups=heads // kv_heads)
