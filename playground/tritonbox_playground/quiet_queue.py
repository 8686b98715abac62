"""Gradio's queue, woken by work instead of by a clock, so an idle playground costs no CPU.

Why: gradio 6's `Queue.start_processing` sleeps 1 ms and tries again whenever it has nothing to
dispatch, and `start_progress_updates` does the same every 10 ms: ~1,100 wake-ups a second that
kept ~5% of a core busy with nobody on the page (issue 22; docs/playground.md has the numbers).
Only two things can give the dispatcher work: an event pushed onto the queue, or a running job
ending (it frees a worker and a concurrency slot). Here both set an `asyncio.Event` the loop
waits on; the progress loop sleeps until a job starts. The dispatch body is gradio's own, copied
unchanged.

The playground's one use of gradio's private API (`Blocks._queue`, the instance's `__class__`,
the Queue's internals), kept for what it measures: an idle server 4.5% -> 0.25% of a core
(scripts/benchmarks/private_apis.py; docs/dependencies.md). gradio has no public way to change
the loops. tests/playground/test_quiet_queue.py pins gradio's version and the source of both
loops, so an upgrade that changes them fails a test, naming the version, instead of silently
running stale code.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import gradio as gr
from gradio.queueing import Event, Queue
from gradio.utils import run_coro_in_background, set_task_name

GRADIO_PIN = "6.31.0"  # requirements/playground.txt: the gradio whose loops are copied here


class QuietQueue(Queue):
    """A gradio Queue whose loops wait for work. Made with `quieten()`, never constructed."""

    _work: asyncio.Event  # set when an event is pushed or a job ends: the dispatcher looks again
    _jobs: asyncio.Event  # set when a job starts: the progress loop has something to report

    def _nudge(self) -> None:
        self._work.set()
        self._jobs.set()

    async def push(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().push(*args, **kwargs)
        finally:
            self._nudge()

    async def process_events(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().process_events(*args, **kwargs)
        finally:
            self._nudge()  # a worker and a concurrency slot are free again

    def start(self) -> None:
        # Fresh events on the loop that runs the queue (an asyncio.Event binds to its first).
        self._work, self._jobs = asyncio.Event(), asyncio.Event()
        super().start()

    def close(self) -> None:
        super().close()
        self._nudge()  # so the loops see `stopped`

    async def start_processing(self) -> None:
        try:
            while not self.stopped:
                # Cleared before looking: a push while we look (the lock may yield) sets it
                # again, so no wake-up is lost between the look and the wait.
                self._work.clear()
                if len(self) == 0 or None not in self.active_jobs:
                    await self._work.wait()
                    continue

                async with self.delete_lock:
                    event_batch = self.get_events()

                if event_batch:  # from here to the dispatch: gradio 6.31's body, unchanged
                    events, batch, concurrency_id = event_batch
                    self.active_jobs[self.active_jobs.index(None)] = events
                    event_queue = self.event_queue_per_concurrency_id[concurrency_id]
                    event_queue.current_concurrency += 1
                    start_time = time.time()
                    fn = events[0].fn
                    event_queue.start_times_per_fn[fn].add(start_time)
                    for event in events:
                        if (a := self.event_analytics.get(event._id)) is not None:
                            a["status"] = "processing"
                    process_event_task = run_coro_in_background(
                        self.process_events, events, batch, start_time, fn
                    )
                    set_task_name(
                        process_event_task, events[0].session_hash, fn._id, events[0]._id, batch
                    )
                    self._asyncio_tasks.add(process_event_task)
                    process_event_task.add_done_callback(self._asyncio_tasks.discard)
                    if self.live_updates:
                        self.broadcast_estimations(concurrency_id)
                    self._jobs.set()
                else:  # every queued event waits for a concurrency slot: a job's end frees one
                    await self._work.wait()
        finally:
            self.stopped = True
            self._cancel_asyncio_tasks()

    async def start_progress_updates(self) -> None:
        while not self.stopped:
            self._jobs.clear()
            running: list[Event] = [e for job in self.active_jobs if job is not None for e in job]
            if not running:
                await self._jobs.wait()  # nothing runs, so no progress to send
                continue
            for event in running:  # gradio's own, every 10 ms while jobs run
                if event.progress_pending and event.progress:
                    event.progress_pending = False
                    self.send_message(event, event.progress)
            await asyncio.sleep(self.progress_update_sleep_when_free)


def quieten(demo: gr.Blocks) -> None:
    """Make `demo`'s queue (after `demo.queue()`, before launch) a QuietQueue. The instance is
    kept (routes and launch() already hold it and set its limits); only its loops change."""
    queue = demo._queue
    queue.__class__ = QuietQueue
    assert isinstance(queue, QuietQueue)  # narrows the type for mypy
    queue._work, queue._jobs = asyncio.Event(), asyncio.Event()  # start() renews them
