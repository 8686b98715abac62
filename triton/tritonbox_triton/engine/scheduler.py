"""In-flight batching for a Hugging Face causal LM on CPU.

One background thread owns the model. Each iteration it drops cancelled sequences, admits
waiting requests (those that arrived together prefilled in one pass, prefill.py; first tokens
emitted at once), then runs one decode step for every running sequence together (written out
over prepacked weights where the model allows, decode_step.py). A request that arrives while
others decode therefore waits at most for the step in progress, and a finished or cancelled
sequence leaves the batch before the next step.

transformers' own continuous batching (`init_continuous_batching`) was not used: its per-request
settings cover temperature, top-k and top-p only, not penalties, min_tokens, seeds or word
lists, which every request here may set.

Longer than 250 lines because the batching loop's admission, prefill, decode and cancellation share
one lock and one state; split, each part would reach into the others'.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from . import prefill, prompt_logprobs
from .admission import BurstWindow, first_pass
from .attention import padding_block
from .batch_choice import choose_tokens
from .decode_step import DecodeStep
from .family import unsupported
from .fused_ops import load as load_fused_ops
from .heap import release_free_memory
from .kv_batch import BatchedKVCache, Layers, prefilled_layers
from .lora_layers import EngineAdapter, LoraRows
from .params import EngineLimits, SamplingParams
from .sampling import SequenceState, TokenChoice
from .stats import IterationStats
from .thread_slice import request_slice
from .words import Decode, WordRules

log = logging.getLogger(__name__)
TopLogprobs = tuple[list[int], list[float]]  # one token's best alternatives: ids, log-probs

# How long a stop for an id the engine has not seen yet is kept (the stop may overtake its
# request on the way in). A stop for a known request, waiting or running, acts at once.
EARLY_STOP_TTL_S = 60.0
# How often clients are asked whether they left: each question is a round trip to Triton, which
# on a loaded CPU costs milliseconds, once per request. A `stop` is seen at every step.
CANCEL_CHECK_S = 0.1
# Idle this long, the engine gives the memory its work freed back to the system (heap.py).
IDLE_TRIM_S = 1.0


class EngineFinish(StrEnum):
    STOP = "stop"  # the end id
    LENGTH = "length"
    STOP_WORD = "stop_word"


class TokenSink(Protocol):
    """Where one request's results go (a Triton response sender, or a test's collector)."""

    def is_cancelled(self) -> bool: ...

    def on_tokens(
        self,
        tokens: list[int],
        logprobs: list[float],
        finish: EngineFinish | None,
        top: Sequence[TopLogprobs] = (),
    ) -> None:
        """New tokens; `finish` is set on the last call. `top`: per token, its request's
        `num_top_logprobs` best (ids, log-probs); empty when it asked for none."""

    def on_error(self, message: str) -> None:
        """The request failed; no further calls follow."""

    def on_cancelled(self) -> None:
        """The request was cancelled by its client; no further calls follow."""

    def on_prompt(self, scores: prompt_logprobs.PromptScores) -> None:
        """The prompt's scores, when asked for: before the request's first `on_tokens`."""


class EngineObserver(Protocol):
    def on_iteration(self, stats: IterationStats) -> None: ...

    def on_tokens(self, count: int) -> None: ...

    def on_finished(self, outcome: str) -> None: ...


class _NullObserver:
    def on_iteration(self, stats: IterationStats) -> None:
        pass

    def on_tokens(self, count: int) -> None:
        pass

    def on_finished(self, outcome: str) -> None:
        pass


@dataclass(eq=False)  # identity: two equal requests are still two requests
class EngineRequest:
    prompt: list[int]
    params: SamplingParams
    sink: TokenSink
    stop_words: list[list[int]]
    bad_words: list[list[int]]
    request_id: str = ""
    # Held until the request finishes, so an adapter evicted from the cache meanwhile stays.
    lora: EngineAdapter | None = None

    @property
    def reserved_tokens(self) -> int:
        return len(self.prompt) + self.params.max_tokens


@dataclass
class _Running:
    request: EngineRequest
    state: SequenceState
    held: list[TokenChoice] = field(default_factory=list)  # made, not sent yet (_holds)


# From this many running sequences on, a token that neither starts nor ends its sequence is held
# and sent with the next one. Every response costs ~0.8 ms of CPU on its way to the client (the
# sending thread, tritonserver, the api or the postprocessing stub, the client itself); at 16
# streams that was a fifth of the two cores, taken from the engine's steps (docs/cpu-engine.md,
# "The loop"; the ninth round in docs/cpu-engine-history.md). Below it every token leaves as
# it is made.
PAIRS_FROM = 8


class InflightBatcher:
    """Serves `EngineRequest`s with in-flight batching on one background thread."""

    def __init__(
        self,
        model: PreTrainedModel,
        decode: Decode,
        limits: EngineLimits,
        *,
        max_batch_size: int,
        max_queue_size: int = 0,
        observer: EngineObserver | None = None,
        lora_rows: LoraRows | None = None,
        threads: int = 0,
        kernel_dir: Path | None = None,
        bursts: BurstWindow | None = None,
    ) -> None:
        self._model = model
        self._threads = threads  # torch threads of the engine's thread (0: torch's default)
        # Decodes batches without adapters instead of the model's forward; the two give the
        # same logits bit for bit (decode_step.py).
        reason = unsupported(model)
        # kernel_dir: where fused_ops.py's library is built (None: the user's cache).
        self._fast_step = DecodeStep(model, load_fused_ops(kernel_dir)) if reason is None else None
        if reason is not None:
            log.warning(
                "decoding with the model's own forward, not the written-out step: %s. It "
                "serves the same answers at about half the written-out step's speed or less "
                "(docs/cpu-engine.md, model families)",
                reason,
            )
        # Set before every forward pass: which adapter each row uses (attach_lora's layers).
        self._lora_rows = lora_rows
        self._decode = decode
        self._limits = limits
        self._max_batch_size = max_batch_size
        self._max_queue_size = max_queue_size  # 0 = unbounded, as MAX_QUEUE_SIZE
        self._observer: EngineObserver = observer or _NullObserver()
        self._waiting: deque[EngineRequest] = deque()
        self._running: list[_Running] = []
        self._kv = self._new_cache()
        self._wakeup = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._stop_ids: dict[str, float] = {}  # request id -> when the stop arrived
        self._iteration = 0
        self._clients_asked = 0.0
        self._step = {"context": 0, "context_tokens": 0, "generation": 0}
        # bursts: how long an idle engine waits for the rest of a burst (None: admission.py's).
        self._bursts = bursts or BurstWindow()
        self._queue_started = 0.0  # when the oldest waiting request arrived
        self._slice = "not started"  # the engine thread's scheduler slice, for describe()
        self._slice_set = threading.Event()

    def submit(self, request: EngineRequest) -> bool:
        """Queue `request`; False (and the request failed) when MAX_QUEUE_SIZE are waiting."""
        with self._wakeup:
            full = 0 < self._max_queue_size <= len(self._waiting)
            if not full:
                now = time.monotonic()
                self._bursts.arrived(now)
                if not self._waiting:
                    self._queue_started = now
                self._waiting.append(request)
                self._wakeup.notify()
        if full:
            # TensorRT-LLM's executor refuses with this message.
            request.sink.on_error(
                f"Maximum queue size of {self._max_queue_size} has been reached, "
                "please try again later"
            )
            self._observer.on_finished("error")
        return not full

    def stop_request(self, request_id: str) -> None:
        """Cancel the request with this id, waiting or running, as if its client had.

        Triton (2.51) does not pass a gRPC cancellation through an ensemble to its steps, so
        this is how a client of the ensemble stops generation: TensorRT-LLM's `stop` input.
        A waiting request leaves the queue now; a running one before the next step.
        """
        if not request_id:  # requests without an id cannot be stopped by id
            return
        with self._wakeup:
            queued = [r for r in self._waiting if r.request_id == request_id]
            for request in queued:
                self._waiting.remove(request)
            if not queued:
                self._stop_ids[request_id] = time.monotonic()
            self._wakeup.notify()
        self._cancel(queued)

    def _cancel(self, requests: list[EngineRequest]) -> None:
        for request in requests:
            request.sink.on_cancelled()
            self._observer.on_finished("cancelled")

    def _is_cancelled(self, request: EngineRequest, *, ask_client: bool = True) -> bool:
        """A `stop` for it arrived, or (when `ask_client`) its client left. Never called with
        the lock held: asking the client is a round trip to Triton."""
        with self._wakeup:
            if request.request_id and self._stop_ids.pop(request.request_id, None) is not None:
                return True
        return ask_client and request.sink.is_cancelled()

    def start(self) -> None:
        """Serve on a thread of its own, with `threads` torch threads.

        Its caller should then run no parallel torch work of its own (torch.set_num_threads(1)):
        libgomp keeps a team of workers for every thread that starts a parallel region, and once
        more workers exist than cores it stops spinning between regions. Each of a step's ~200
        matrix products then waits for its worker to wake: a decode step took 57 ms instead of
        27 ms (docs/cpu-engine.md).
        """
        self._thread = threading.Thread(target=self._loop, name="inflight-batcher", daemon=True)
        self._thread.start()
        self._slice_set.wait(10)  # for describe()

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._wakeup:
            waiting = list(self._waiting)
        for request in [*waiting, *(r.request for r in self._running)]:
            request.sink.on_error("the engine is shutting down")
        self._waiting.clear()
        self._running.clear()

    def _loop(self) -> None:
        # Before the first parallel region: its OpenMP workers inherit the slice (thread_slice.py).
        try:
            self._slice = request_slice()
        finally:
            self._slice_set.set()
        if self._threads > 0:
            # OpenMP's thread count is per calling thread: the engine's own (start() says more).
            torch.set_num_threads(self._threads)
        trimmed = True  # nothing freed yet
        while not self._stopping:
            trimmed = trimmed and not (self._running or self._waiting)
            try:
                busy = self.run_once()
            except Exception:  # a bug must not kill the thread that serves everyone
                log.exception("engine iteration failed")
                self._fail_running("internal engine error")
                busy = False
            if busy:
                continue
            # Nothing runs or waits: sleep until submit() or stop() notifies, so an idle engine
            # spends no CPU (stop ids left over expire on the next busy pass). Once quiet for
            # IDLE_TRIM_S, what the work freed goes back to the system (heap.py), once: later
            # than that, so that a request arriving right after another never waits for it.
            if not trimmed and self._quiet_for(IDLE_TRIM_S):
                release_free_memory()  # without the lock: a submit() does not wait for it
                trimmed = True
            with self._wakeup:
                if not self._waiting and not self._stopping:
                    self._wakeup.wait()

    def _quiet_for(self, seconds: float) -> bool:
        """Whether nothing arrives (and no stop) for `seconds`."""
        with self._wakeup:
            if self._waiting or self._stopping:
                return False
            return not self._wakeup.wait(seconds) and not (self._waiting or self._stopping)

    def describe(self) -> str:
        """The start-up log line's words for how batches without adapters are decoded."""
        how = "the model's forward"
        if self._fast_step is not None:
            how = f"the written-out step, {self._fast_step.describe()}"
        return f"{how}; on {self._slice}"

    @torch.inference_mode()
    def run_once(self) -> bool:
        """One iteration: cancellations, admissions, one decode step. False when idle."""
        self._step = dict.fromkeys(self._step, 0)
        now = time.monotonic()
        ask_clients = now - self._clients_asked >= CANCEL_CHECK_S
        if ask_clients:
            self._clients_asked = now
        self._drop_cancelled(ask_clients)
        if ask_clients:
            self._drop_cancelled_waiting()
        if self._admit(self._await_burst()):
            # The rest of a wave split in passes (admission.py), and those that came in during a
            # prefill, take theirs now rather than after a step: the step then runs for all of
            # them, which costs little more than for the first (its products read the weights
            # once either way), and they stay in step. A large rest is split again, as a wave.
            while self._admit(self._next_pass()):
                pass
        if self._running:
            self._decode_step()
        self._report()
        return bool(self._running or self._waiting)

    def _await_burst(self) -> int | None:
        """Idle with requests waiting: give the rest of a burst its moment to arrive, while
        requests come in bursts; then how many to prefill in the first pass (admission.py).
        None when busy or nothing waits: the batch's room is the only limit."""
        with self._wakeup:
            if self._running or not self._waiting:
                return None
            while not self._stopping and len(self._waiting) < self._max_batch_size:
                # Each arrival moves the deadline (a quiet gap ends the burst), so it is asked anew.
                until = self._bursts.wait_until(
                    self._queue_started, time.monotonic(), len(self._waiting), self._max_batch_size
                )
                left = -1.0 if until is None else until - time.monotonic()
                if left <= 0:
                    break
                self._wakeup.wait(left)
            if len(self._waiting) == 1:
                self._bursts.alone()
            return self._bursts.first_pass_size(
                self._queue_started, len(self._waiting), self._max_batch_size
            )

    def _next_pass(self) -> int:
        """How many of those waiting the next pass before the step takes (admission.py)."""
        with self._wakeup:
            return first_pass(len(self._waiting))

    def _report(self) -> None:
        self._iteration += 1
        with self._wakeup:
            waiting = len(self._waiting)
        self._observer.on_iteration(
            IterationStats(
                iteration=self._iteration,
                timestamp_us=time.time_ns() // 1000,
                active=len(self._running),
                waiting=waiting,
                max_active=self._max_batch_size,
                kv_tokens_used=sum(len(r.state.context()) for r in self._running),
                kv_tokens_max=self._limits.kv_cache_max_tokens,
                **self._step,
            )
        )

    def _drop_cancelled_waiting(self) -> None:
        """Requests whose clients left while they waited leave the queue."""
        with self._wakeup:
            waiting = list(self._waiting)
        gone = [request for request in waiting if self._is_cancelled(request)]
        if gone:
            with self._wakeup:
                for request in gone:
                    if request in self._waiting:
                        self._waiting.remove(request)
            self._cancel(gone)

    def _drop_cancelled(self, ask_clients: bool) -> None:
        with self._wakeup:
            if self._stop_ids:
                expired = time.monotonic() - EARLY_STOP_TTL_S
                self._stop_ids = {k: t for k, t in self._stop_ids.items() if t > expired}
        keep = [
            i
            for i, run in enumerate(self._running)
            if not self._is_cancelled(run.request, ask_client=ask_clients)
        ]
        if len(keep) == len(self._running):
            return
        for i, run in enumerate(self._running):
            if i not in keep:
                run.request.sink.on_cancelled()
                self._observer.on_finished("cancelled")
        self._keep(keep)

    def _reserved(self) -> int:
        return sum(run.request.reserved_tokens for run in self._running)

    def _admit(self, limit: int | None = None) -> int:
        """Prefill waiting requests while the batch has room, `limit` of them at most; how many
        it admitted."""
        admitted: list[EngineRequest] = []
        room = self._max_batch_size - len(self._running)
        most = room if limit is None else min(room, limit)
        while len(admitted) < most:
            with self._wakeup:
                if not self._waiting:
                    break
                request = self._waiting[0]
                reserved = self._reserved() + sum(r.reserved_tokens for r in admitted)
                if (self._running or admitted) and (
                    reserved + request.reserved_tokens > self._limits.kv_cache_max_tokens
                ):
                    break  # wait for KV cache room; the request stays first in line
                self._waiting.popleft()
            if self._is_cancelled(request):
                self._cancel([request])
                continue
            admitted.append(request)
        shared = [r for r in admitted if prefill.shareable(r.params, r.lora is not None)]
        shared_ids = {id(r) for r in shared}
        runs = [[shared[i] for i in run] for run in prefill.groups([r.prompt for r in shared])]
        runs += [[r] for r in admitted if id(r) not in shared_ids]
        for run in runs:
            try:
                lone = run[0] if len(run) == 1 and id(run[0]) in shared_ids else None
                if len(run) > 1 or (lone is not None and self._lone_exact(lone)):
                    self._prefill_shared(run)
                elif lone is not None and self._twin_exact(lone):
                    self._prefill_shared(run, copies=2)
                else:
                    self._prefill(run[0])
            except Exception as error:
                log.exception("prefill failed")
                for request in run:
                    request.sink.on_error(f"prefill failed: {error}")
                    self._observer.on_finished("error")
        return len(admitted)

    def _prefill_shared(self, requests: list[EngineRequest], copies: int = 1) -> None:
        """One pass for these prompts that need nothing but their next token (prefill.py), over
        the prepacked weights where the model has them (decode_step.py). A lone one comes here
        only where that gives `_prefill`'s bits (generate()'s twin reference): once, or as
        twin rows (`copies`), in a half or two thirds of `_prefill`'s time."""
        prompts = [r.prompt for r in requests] * copies
        if self._lora_rows is not None:
            self._lora_rows.use([None] * len(prompts))
        if self._fast_step is not None:
            logits, layers = self._fast_step.prefill(prompts)
        else:
            logits, layers = prefill.prefill_together(self._model, prompts)
        self._step["context"] += len(requests)
        self._step["context_tokens"] += sum(len(r.prompt) for r in requests)
        rows = len(requests)  # a twin's copy is left out
        self._start(requests, logits[:rows].float(), layers[:rows])

    def _lone_exact(self, request: EngineRequest) -> bool:
        """Whether a lone prompt's single pass over the prepacked weights gives `_prefill`'s
        bits."""
        return self._fast_step is not None and self._fast_step.lone_exact_for(len(request.prompt))

    def _twin_exact(self, request: EngineRequest) -> bool:
        """Whether a lone prompt's twin pass over the prepacked weights gives `_prefill`'s bits."""
        return self._fast_step is not None and self._fast_step.exact_for(len(request.prompt))

    def _prefill(self, request: EngineRequest) -> None:
        cache = DynamicCache(config=self._model.config)
        # A lone prompt runs as two identical rows, as the twin reference generate() does: the
        # products' sums depend on the number of rows (oneDNN's over 32 rows, MKL's float32 ones
        # of an adapter at some counts), so a 34-token prompt alone rounds otherwise than twice.
        if self._lora_rows is not None:
            self._lora_rows.use([request.lora] * 2)
        output = self._model(
            input_ids=torch.tensor([request.prompt] * 2),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=prompt_logprobs.logits_to_keep(request.params),
        )
        self._step["context"] += 1
        self._step["context_tokens"] += len(request.prompt)
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
            _Running(
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
        going = [i for i, run in enumerate(runs) if not self._advance(run, choices[i])]
        self._kv.add_prefilled(*(layers[i] for i in going))
        self._running.extend(runs[i] for i in going)

    def _decode_step(self) -> None:
        valid, positions = self._kv.decode_inputs()
        # A lone sequence runs as two identical rows (kv_batch.py says why).
        rows = self._running * (self._kv.shown_rows // len(self._running))
        last = torch.tensor([[run.state.generated[-1]] for run in rows])
        adapters = False
        if self._lora_rows is not None:
            self._lora_rows.use([run.request.lora for run in rows])
            adapters = bool(self._lora_rows.groups)
        if self._fast_step is not None and not adapters:
            kv = self._kv
            step = self._fast_step(
                last[:, 0], positions[:, 0], valid, kv.key_buffers, kv.value_buffers
            )
        else:
            output = self._model(
                input_ids=last,
                attention_mask=valid[:, None, None, :],  # 4-D: taken as it is
                position_ids=positions,
                past_key_values=self._kv.cache,
                use_cache=True,
            )
            step = output.logits[:, -1]
        self._kv.advance()
        self._step["generation"] = len(self._running)
        # A lone sequence's twin row (kv_batch.py) is left out.
        logits = step[: len(self._running)].float()
        choices = choose_tokens(logits, [run.state for run in self._running])
        keep = [
            i
            for i, (run, choice) in enumerate(zip(self._running, choices, strict=True))
            if not self._advance(run, choice)
        ]
        if len(keep) != len(self._running):
            ended = len(self._running) - len(keep)
            self._keep(keep)
            with self._wakeup:
                self._bursts.ended(ended, time.monotonic(), idle=not self._running)

    def _keep(self, keep: list[int]) -> None:
        """Only the running rows `keep`: a survivor keeps its row unless that row is past the
        new end, and the last survivors fill the gaps the others left, so the KV cache copies
        only those (kv_batch.py)."""
        kept = set(keep)
        tail = [row for row in keep if row >= len(keep)]
        order = [row if row in kept else tail.pop() for row in range(len(keep))]
        self._running = [self._running[row] for row in order]
        self._kv.keep_rows(order)

    def _advance(self, run: _Running, choice: TokenChoice) -> bool:
        """Emit `run`'s chosen token; True when the sequence has finished."""
        state, params, sink = run.state, run.request.params, run.request.sink
        state.append(choice.token)
        self._observer.on_tokens(1)
        finish: EngineFinish | None = None
        if choice.token == params.end_id:
            # The end token is sent too, with its log-prob (vLLM's and OpenAI's log-probs have
            # its entry; an evaluation harness scores it); the api keeps it out of the text. A
            # grammar's end without an end id (-1, sampling.py) is no token: not sent.
            finish = EngineFinish.STOP
        elif state.words.hits_stop_word(state.generated):
            finish = EngineFinish.STOP_WORD
        elif len(state.generated) >= params.max_tokens:
            finish = EngineFinish.LENGTH
        if finish is None and self._holds(run):
            run.held.append(choice)
            return False
        sent, run.held = [*run.held, *([choice] if choice.token >= 0 else [])], []
        top = [(c.top_ids, c.top_logprobs) for c in sent] if params.num_top_logprobs else []
        sink.on_tokens([c.token for c in sent], [c.logprob for c in sent], finish, top)
        if finish is not None:
            self._observer.on_finished(finish.value)
        return finish is not None

    def _holds(self, run: _Running) -> bool:
        """Whether `run`'s token just made waits to go with its next one (`PAIRS_FROM`): not
        its first, not one after a held one, not one asked with its top log-probs."""
        return (
            len(self._running) >= PAIRS_FROM
            and not run.held
            and len(run.state.generated) > 1
            and not run.request.params.num_top_logprobs
        )

    def _new_cache(self) -> BatchedKVCache:
        config = self._model.config
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        # Decided here, at start, rather than inside the first request's prefill (~0.3 s).
        padding_block(self._model.dtype, kv_heads, heads // kv_heads, dim)
        return BatchedKVCache(query_groups=heads // kv_heads)

    def _fail_running(self, message: str) -> None:
        for run in self._running:
            run.request.sink.on_error(message)
            self._observer.on_finished("error")
        self._running = []
        self._kv = self._new_cache()
