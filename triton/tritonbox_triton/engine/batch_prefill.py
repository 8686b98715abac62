"""How admitted requests are prefilled into the decode batch (a part of `RunningBatch`,
running_batch.py, kept apart so that each file reads as one thing): prompts that need nothing
but their next token share a pass (prefill.py), over the prepacked weights where the model
allows (decode_step.py); a lone prompt once, or as twin rows, where that gives the bits of the
model's forward on twin rows, else through that forward, as is a prompt with an adapter or
prompt log-probs (docs/cpu-engine.md, "Exactness, and why"). A long prompt while streams run is
prefilled in chunks beside them, and a prompt that starts as a cached one continues from its
keys and values (filling.py, prefix_cache.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from . import prefill
from .chunk_budget import ChunkBudget
from .decode_step import DecodeStep
from .filling import Filling, PromptChunk, step_chunks
from .kv_batch import Layers
from .lora_layers import LoraRows
from .prefix_cache import BLOCK, PrefixCache
from .request import EngineObserver, EngineRequest, Running
from .timings import EngineTimings

log = logging.getLogger(__name__)


class BatchPrefill:
    """`RunningBatch`'s prefills."""

    model: PreTrainedModel
    fast_step: DecodeStep | None
    running: list[Running]
    counts: dict[str, int]
    _lora_rows: LoraRows | None
    _observer: EngineObserver

    def __init__(self, timings: EngineTimings) -> None:
        self.fillings: list[Filling] = []  # prompts prefilled in chunks (step_chunks orders them)
        self.prefixes = PrefixCache(timings.prefix_cache_bytes)
        self.budget = ChunkBudget(timings.prefill_chunk_tokens)
        self._whole_s = timings.whole_prefill_s  # a prompt this cheap is never cut

    def _start(self, requests: list[EngineRequest], logits: torch.Tensor,
               layers: list[Layers]) -> None:  # fmt: skip
        raise NotImplementedError  # RunningBatch's

    def _prefill(self, request: EngineRequest) -> None:
        raise NotImplementedError  # RunningBatch's: through the model's forward

    def prefill(self, admitted: list[EngineRequest], *, burst: bool = False) -> None:
        """Prefill `admitted` and send their first tokens; those that go on join the batch.
        A failed pass fails its own requests only. A long prompt, or one that starts as a
        prompt before it did, goes last, and in chunks or from that prefix (filling.py).
        Chunks protect streams that ran before: a burst at an idle engine (`burst`: the rest
        of one, after its first pass) is prefilled in passes (prefill.py), which take it in
        far fewer passes over the weights than chunks would."""
        busy = bool(self.running) and not burst
        filling = [r for r in admitted if self._fills(r, busy)]
        chunked = {id(r) for r in filling}
        self._prefill_now([r for r in admitted if id(r) not in chunked], busy)
        for request in filling:
            try:
                self._start_filling(request)
            except Exception as error:
                self._failed([request], error)
        if filling and not self.running:
            self._fill()

    def _failed(self, requests: list[EngineRequest], error: Exception) -> None:
        """A pass for `requests` raised `error` (logged once): each of them fails, no other."""
        log.exception("prefill failed")
        for request in requests:
            request.sink.on_error(f"prefill failed: {error}")
            self._observer.on_finished("error")

    def _prefill_now(self, admitted: list[EngineRequest], busy: bool) -> None:
        """`admitted`'s passes. A lone prompt takes the exact path for its length (checked
        once per length, at about the cost of its pass) at an idle engine only: beside
        running streams, with every prompt a new length, the checks doubled the time to first
        token, so there it is one pass, whose values may move within bfloat16's rounding as a
        shared pass's do (docs/cpu-engine.md, exactness)."""
        shared = [r for r in admitted if prefill.shareable(r.params, r.lora is not None)]
        shared_ids = {id(r) for r in shared}
        # Beside streams a prompt that came alone takes one pass without a check, so prompts
        # of far apart lengths go apart rather than padded together; at an idle engine a lone
        # prompt's exact path costs more than the padding.
        padding = self.budget.padding_worth() if busy else None
        prompts = [r.prompt for r in shared]
        runs = [[shared[i] for i in run] for run in prefill.groups(prompts, most_padding=padding)]
        runs += [[r] for r in admitted if id(r) not in shared_ids]
        for run in runs:
            try:
                lone = run[0] if len(run) == 1 and id(run[0]) in shared_ids else None
                # A lone prompt in one pass: beside streams always, else where exact.
                fast = self.fast_step is not None
                once = lone is not None and ((busy and fast) or self._lone_exact(lone))
                if len(run) > 1 or once:
                    self.prefill_shared(run)
                elif lone is not None and self._twin_exact(lone):
                    self.prefill_shared(run, copies=2)
                else:
                    self._prefill(run[0])
            except Exception as error:
                self._failed(run, error)

    def prefill_shared(self, requests: list[EngineRequest], copies: int = 1) -> None:
        """One pass for these prompts that need nothing but their next token (prefill.py), over
        the prepacked weights where the model has them (decode_step.py). A lone one comes here
        only where that gives `_prefill`'s bits (generate()'s twin reference): once, or as
        twin rows (`copies`), in a half or two thirds of `_prefill`'s time."""
        prompts = [r.prompt for r in requests] * copies
        if self._lora_rows is not None:
            self._lora_rows.use([None] * len(prompts))
        if self.fast_step is not None:
            began = time.perf_counter()
            logits, layers = self.fast_step.prefill(prompts)
            self.budget.passed(time.perf_counter() - began, sum(map(len, prompts)))
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

    def chunked(self, request: EngineRequest, busy: bool) -> bool:
        """Whether `request`, admitted now, would be prefilled in chunks beside running streams
        (`busy`; filling.py): a prompt longer than a chunk that costs more than
        `whole_prefill_s`."""
        chunk, length = self.budget.tokens(), len(request.prompt)
        return (
            busy
            and length > chunk > 0
            and self._fillable(request)
            and not self.budget.whole(0, length, self._whole_s)
        )

    def _fillable(self, request: EngineRequest) -> bool:
        shareable = prefill.shareable(request.params, request.lora is not None)
        return shareable and self.fast_step is not None and self.fast_step.fills_exact

    def _fills(self, request: EngineRequest, busy: bool) -> bool:
        """Whether `request` is prefilled in chunks beside streams or from a cached prefix."""
        if not self._fillable(request) or len(request.prompt) <= BLOCK:
            return False
        return self.chunked(request, busy) or self.prefixes.covers(request.prompt)

    def _start_filling(self, request: EngineRequest) -> None:
        """`request` among `fillings`, from its cached prefix if any (filling.py)."""
        assert self.fast_step is not None
        prefix = self.prefixes.lookup(request.prompt)
        filling = Filling(request, self.fast_step.kv_layout(), prefix)
        filling.whole = self.budget.whole(filling.done, filling.left, self._whole_s)
        self.fillings.append(filling)

    def drop_fillings(self, cancelled: Callable[[EngineRequest], bool]) -> list[EngineRequest]:
        """The filling prompts whose requests are `cancelled`, taken out."""
        gone = [f for f in self.fillings if cancelled(f.request)]
        self.fillings = [f for f in self.fillings if f not in gone]
        return [f.request for f in gone]

    def _fill(self, logits: torch.Tensor | None = None, chunks: list[PromptChunk] | None = None,
              ) -> None:  # fmt: skip
        """The filling prompts' next chunks: with `chunks`, the step that carried them gave
        `logits`, a row for each chunk that ended its prompt; else (no stream waits for them,
        or the step took the model's forward) they run alone now, the whole of what is left of
        each where no stream runs."""
        assert self.fast_step is not None
        if not chunks:
            chunks = step_chunks(self.fillings, self.budget if self.running else None)
            ends = [self.fast_step.extend(chunk) for chunk in chunks if chunk.last]
            logits = torch.cat(ends) if ends else None
        done = []
        for filling, chunk in zip(self.fillings, chunks, strict=False):
            filling.advance(chunk)
            self.counts["context_tokens"] += len(chunk.ids)
            if chunk.last:
                done.append(filling)
        if not done:
            return
        assert logits is not None and len(logits) == len(done)
        self.fillings = [f for f in self.fillings if f not in done]
        self.counts["context"] += len(done)
        self._start([f.request for f in done], logits.float(), [f.layers() for f in done])
