"""In-flight batching for a Hugging Face causal LM on CPU: the engine's loop.

One background thread owns the model. Each iteration it drops cancelled sequences
(cancellation.py), admits waiting requests, waiting a moment first for the rest of a burst or a
wave (admission.py; those that arrived together prefilled in one pass, first tokens sent at
once), then runs one decode step for every running sequence together (running_batch.py), whose
tokens leave through responses.py; a finished or cancelled sequence leaves before the next
step. Idle, the thread sleeps, and gives freed memory back once (heap.py). The waits and
thresholds are `EngineTimings` (timings.py).

transformers' own continuous batching (`init_continuous_batching`) was not used: its per-request
settings cover temperature, top-k and top-p only, not penalties, min_tokens, seeds or word
lists, which every request here may set.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from pathlib import Path

import torch
from transformers import PreTrainedModel

from .cancellation import Cancellations
from .decode_step import DecodeStep
from .heap import release_free_memory
from .lora_layers import LoraRows
from .params import EngineLimits
from .request import EngineFinish, EngineObserver, EngineRequest, NullObserver, TopLogprobs
from .responses import Responses
from .running_batch import RunningBatch
from .stats import IterationStats
from .thread_slice import request_slice
from .timings import DEFAULT_TIMINGS, EngineTimings
from .waiting import WaitingQueue
from .words import Decode

# The request types are imported from here by model.py, the tests and the benchmarks.
__all__ = ["EngineFinish", "EngineRequest", "InflightBatcher", "TopLogprobs"]

log = logging.getLogger(__name__)


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
        timings: EngineTimings = DEFAULT_TIMINGS,
    ) -> None:
        # 0: every core it may use (not torch's default: a new thread inherits set_num_threads(1))
        self._threads = threads or len(os.sched_getaffinity(0))
        self._limits = limits
        self._timings = timings
        self._max_batch_size = max_batch_size
        self._max_queue_size = max_queue_size  # 0 = unbounded, as MAX_QUEUE_SIZE
        self._observer: EngineObserver = observer or NullObserver()
        self._queue = WaitingQueue(timings, max_size=max_queue_size, batch=max_batch_size)
        self._cancels = Cancellations(
            self._queue.lock,
            self._observer,
            check_s=timings.cancel_check_s,
            early_stop_ttl_s=timings.early_stop_ttl_s,
        )
        responses = Responses(self._observer, timings.pairs_from)
        self._batch = RunningBatch(model, decode, responses, self._observer, lora_rows=lora_rows,
                                   kernel_dir=kernel_dir, timings=timings,
                                   max_rows=max_batch_size)  # fmt: skip
        self._thread: threading.Thread | None = None
        self._iteration = 0
        self._slice = "not started"  # the engine thread's scheduler slice, for describe()
        self._slice_set = threading.Event()

    @property
    def _fast_step(self) -> DecodeStep | None:
        """The written-out step (None: the model's forward); tests and benchmarks replace it."""
        return self._batch.fast_step

    @_fast_step.setter
    def _fast_step(self, step: DecodeStep | None) -> None:
        self._batch.fast_step = step

    def submit(self, request: EngineRequest) -> bool:
        """Queue `request`; False (and the request failed) when MAX_QUEUE_SIZE are waiting."""
        if self._queue.put(request):
            return True
        # TensorRT-LLM's executor refuses with this message.
        request.sink.on_error(
            f"Maximum queue size of {self._max_queue_size} has been reached, please try again later"
        )
        self._observer.on_finished("error")
        return False

    def stop_request(self, request_id: str) -> None:
        """Cancel the request with this id, waiting or running, as if its client had.

        Triton (2.51) does not pass a gRPC cancellation through an ensemble to its steps, so
        this is how a client of the ensemble stops generation: TensorRT-LLM's `stop` input.
        A waiting request leaves the queue now; a running one before the next step.
        """
        if not request_id:  # requests without an id cannot be stopped by id
            return
        with self._queue.lock:
            queued = self._queue.withdraw(request_id)
            if not queued:
                self._cancels.stopped(request_id)
            self._queue.lock.notify()
        self._cancels.cancel(queued)

    def start(self) -> None:
        """Serve on a thread of its own, with `threads` torch threads.

        Its caller should then run no parallel torch work of its own (torch.set_num_threads(1)):
        libgomp keeps a team of workers per thread that starts a parallel region; with more
        workers than cores they stop spinning, and each of a step's ~200 products waits for its
        worker to wake (a step took 57 ms, not 27: docs/cpu-engine.md)."""
        self._thread = threading.Thread(target=self._loop, name="inflight-batcher", daemon=True)
        self._thread.start()
        self._slice_set.wait(10)  # for describe()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._queue.stop()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._batch.fail("the engine is shutting down")
        for request in self._queue.drain():
            request.sink.on_error("the engine is shutting down")

    def describe(self) -> str:
        """The start-up log line's words for how batches without adapters are decoded."""
        how = "the model's forward"
        if self._fast_step is not None:
            how = f"the written-out step, {self._fast_step.describe()}"
        return f"{how}; on {self._slice}"

    def _loop(self) -> None:
        # Before the first parallel region: its OpenMP workers inherit the slice (thread_slice.py).
        try:
            self._slice = request_slice()
        finally:
            self._slice_set.set()
        # OpenMP's thread count is per calling thread: the engine's own (start() says more).
        torch.set_num_threads(self._threads)
        trimmed = True  # nothing freed yet
        while not self._queue.stopping:
            trimmed = trimmed and not (self._batch.running or len(self._queue))
            try:
                busy = self.run_once()
            except Exception:  # a bug must not kill the thread that serves everyone
                log.exception("engine iteration failed")
                self._batch.fail("internal engine error")
                busy = False
            if busy:
                continue
            # Nothing runs or waits: sleep until submit() or stop() notifies, so an idle engine
            # spends no CPU (stop ids left over expire on the next busy pass). Once quiet for
            # idle_trim_s, what the work freed goes back to the system (heap.py), once: later
            # than that, so that a request arriving right after another never waits for it.
            if not trimmed and self._queue.quiet_for(self._timings.idle_trim_s):
                release_free_memory()  # without the lock: a submit() does not wait for it
                trimmed = True
            self._queue.sleep()

    @torch.inference_mode()
    def run_once(self) -> bool:
        """One iteration: cancellations, admissions, one decode step. False when idle."""
        batch, queue = self._batch, self._queue
        batch.counts = dict.fromkeys(batch.counts, 0)
        ask_clients = self._cancels.clients_due(time.monotonic())
        if (keep := self._cancels.running_kept(batch.running, ask_clients)) is not None:
            batch.keep(keep)
        if ask_clients:
            self._cancels.drop_waiting(queue.requests)
        if batch.fillings:
            cancelled = functools.partial(self._cancels.is_cancelled, ask_client=ask_clients)
            self._cancels.cancel(batch.drop_fillings(cancelled))
        busy, began = bool(batch.running), time.monotonic()
        admissions = [self._admit(queue.first_pass(busy=busy))]
        # The rest of a wave split in passes (admission.py), and those that came in during a
        # prefill, take theirs now rather than after a step, which then runs for all of them
        # (reading the weights once) and keeps them in step. Streams that ran before wait for
        # such passes up to whole_prefill_s, long prompts in chunks (timings.py).
        limit = self._timings.whole_prefill_s
        while admissions[-1] and (not busy or time.monotonic() - began < limit):
            admissions.append(self._admit(queue.next_pass(), burst=not busy))
        # Stops that came during the prefills act before the step rather than after it: a
        # live request's stops of batch lines (the api's) then save the lines' next step.
        stopped = self._cancels.stops_pending()
        if stopped and (keep := self._cancels.running_kept(batch.running, False)) is not None:
            batch.keep(keep)
        if (batch.running or batch.fillings) and (ended := batch.decode_step()):
            queue.ended(ended, idle=not batch.running)
        self._report([admitted for admitted in admissions if admitted])
        return bool(batch.running or batch.fillings or len(queue))

    def _admit(self, limit: int | None = None, *, burst: bool = False) -> int:
        """Prefill waiting requests while the batch has room and their KV reservations fit
        (else the first stays first in line), `limit` of them at most; how many it admitted.
        Long prompts among them fill in chunks beside the streams that ran before (filling.py),
        unless they are the rest of a `burst` (batch_prefill.py)."""
        batch = self._batch
        admitted: list[EngineRequest] = []
        room = self._max_batch_size - len(batch.running) - len(batch.fillings)
        most = room if limit is None else min(room, limit)
        while len(admitted) < most:
            reserved = batch.reserved() + sum(r.reserved_tokens for r in admitted)
            busy = bool(batch.running or batch.fillings or admitted)
            request = self._queue.pop_fitting(
                reserved, self._limits.kv_cache_max_tokens, must_fit=busy
            )
            if request is None:
                break
            if self._cancels.is_cancelled(request):
                self._cancels.cancel([request])
                continue
            admitted.append(request)
        batch.prefill(admitted, burst=burst)
        return len(admitted)

    def _report(self, admissions: list[int]) -> None:
        """This iteration's counts for /metrics (stats.py); `admissions`: each prefill's count."""
        self._iteration += 1
        running = self._batch.running
        self._observer.on_iteration(
            IterationStats(
                iteration=self._iteration,
                timestamp_us=time.time_ns() // 1000,
                active=len(running),
                waiting=len(self._queue),
                max_active=self._max_batch_size,
                kv_tokens_used=sum(len(r.state.context()) for r in running),
                kv_tokens_max=self._limits.kv_cache_max_tokens,
                admissions=tuple(admissions),
                **self._batch.counts,
            )
        )
