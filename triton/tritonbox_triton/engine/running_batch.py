"""The decode batch: the running sequences and their KV buffers, the prefills that bring requests
into it (batch_prefill.py), and the step that gives each of them its next token, with the
chunk of a prompt being prefilled beside them (filling.py).

The decode step runs the written-out step, or the model's forward when a row has an adapter.
Tokens are chosen from float32 logits (batch_choice.py) and leave through responses.py.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel

from . import prompt_logprobs
from .attention import padding_block
from .batch_choice import choose_tokens
from .batch_prefill import BatchPrefill
from .decode_step import DecodeStep
from .family import unsupported
from .filling import PromptChunk, step_chunks
from .fused_ops import load as load_fused_ops
from .kv_batch import BatchedKVCache, Layers, prefilled_layers
from .lora_layers import LoraRows
from .request import EngineFinish, EngineObserver, EngineRequest, Running
from .responses import Responses
from .sampling import SequenceState
from .timings import DEFAULT_TIMINGS, EngineTimings
from .words import Decode, WordRules

log = logging.getLogger(__name__)


class RunningBatch(BatchPrefill):
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
        timings: EngineTimings = DEFAULT_TIMINGS,
        max_rows: int = 2,
    ) -> None:
        self.model = model
        self._max_rows = max_rows  # MAX_BATCH_SIZE: the KV buffers reserve as many rows
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
        super().__init__(timings)
        self.counts = {"context": 0, "context_tokens": 0, "generation": 0}

    def reserved(self) -> int:
        """Tokens the running requests reserve in the KV cache (prompt + max_tokens each)."""
        filling = sum(filling.request.reserved_tokens for filling in self.fillings)
        return filling + sum(run.request.reserved_tokens for run in self.running)

    def _prefill(self, request: EngineRequest) -> None:
        cache = DynamicCache()  # every layer keeps every key: windows are masked (windowed.py)
        # A lone prompt runs as two identical rows, as the twin reference generate() does: the
        # products' sums depend on the number of rows (oneDNN's over 32 rows, MKL's float32 ones
        # of an adapter at some counts), so a 34-token prompt alone rounds otherwise than twice.
        if self._lora_rows is not None:
            self._lora_rows.use([request.lora] * 2)
        # The prompt's scores come from its final hidden states, a chunk at a time.
        scores = prompt_logprobs.wanted(request.params)
        with prompt_logprobs.final_hidden(self.model, scores) as hidden:
            output = self.model(
                input_ids=torch.tensor([request.prompt] * 2),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        self.counts["context"] += 1
        self.counts["context_tokens"] += len(request.prompt)
        if scores:
            scored = hidden[0][0]  # the first of the twin rows
            prompt_logprobs.send(request.sink, self.model, scored, request.prompt, request.params)
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
        if self.fast_step is None or not self.fast_step.fills_exact:
            return  # nothing would read a cached prefix (batch_prefill.py)
        for request, own in zip(requests, layers, strict=True):
            if request.lora is None:  # an adapter's keys are not the model's own
                self.prefixes.add(request.prompt, own)

    def decode_step(self) -> int:
        """One token for every running sequence, and the filling prompts' next chunks; how many
        ended (they have left the batch)."""
        if not self.running:
            if self.fillings:
                self._fill()
            return 0
        valid, positions = self.kv.decode_inputs()
        # A lone sequence runs as two identical rows (kv_batch.py says why).
        rows = self.running * (self.kv.shown_rows // len(self.running))
        last = torch.tensor([[run.state.generated[-1]] for run in rows])
        adapters = False
        if self._lora_rows is not None:
            self._lora_rows.use([run.request.lora for run in rows])
            adapters = bool(self._lora_rows.groups)
        chunks: list[PromptChunk] = []
        if self.fast_step is not None and not adapters:
            kv = self.kv
            chunks = step_chunks(self.fillings, self.budget)
            began = time.perf_counter()
            step = self.fast_step(
                last[:, 0], positions[:, 0], valid, kv.key_buffers, kv.value_buffers, chunks
            )
            self.budget.observed(time.perf_counter() - began, chunks)
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
        if self.fillings:  # after the rows' tokens: theirs were due first
            self._fill(step[len(rows) :], chunks)
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
        filling = [filling.request for filling in self.fillings]
        for request in [*filling, *(run.request for run in self.running)]:
            request.sink.on_error(message)
            self._observer.on_finished("error")
        self.running, self.fillings = [], []
        self.kv = self._new_cache()

    def _new_cache(self) -> BatchedKVCache:
        config = self.model.config
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        # Decided here, at start, rather than inside the first request's prefill (~0.3 s).
        padding_block(self.model.dtype, kv_heads, heads // kv_heads, dim)
        return BatchedKVCache(query_groups=heads // kv_heads, rows=self._max_rows)
