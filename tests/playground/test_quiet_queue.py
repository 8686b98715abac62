"""An idle playground costs no CPU (issue 22), and its queue still runs every event: the queue
waits for work instead of polling every millisecond (quiet_queue.py)."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import re
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import gradio as gr
import pytest
from gradio.queueing import Queue
from gradio_client import Client
from tritonbox_testing.playground_process import launch_playground
from tritonbox_testing.ports import free_port

from tritonbox_playground.quiet_queue import GRADIO_PIN, QuietQueue, quieten

REPO = Path(__file__).resolve().parents[2]
# gradio 6.31's loops that QuietQueue replaces. A new gradio changes these hashes: re-read
# gradio/queueing.py, carry its changes into quiet_queue.py, then update them here.
GRADIO_LOOPS = {
    "start_processing": "d65be5a5cbed97d7",
    "start_progress_updates": "7cbbec1cf932324c",
}
UPGRADED = (
    f"gradio {version('gradio')} is installed; quiet_queue.py copies gradio {GRADIO_PIN}'s "
    "private Queue loops and swaps Blocks._queue's class: re-read gradio/queueing.py, carry its "
    "changes into quiet_queue.py (or drop it if gradio's queue now waits for work), then move "
    "GRADIO_PIN and the hashes here"
)


def test_gradio_is_the_pinned_version() -> None:
    pinned = re.search(r"^gradio==(\S+)$", (REPO / "requirements/playground.txt").read_text(), re.M)
    assert pinned and pinned.group(1) == GRADIO_PIN, "requirements/playground.txt moved the pin"
    assert version("gradio") == GRADIO_PIN, UPGRADED


def test_the_replaced_loops_are_the_ones_gradio_ships() -> None:
    for name, expected in GRADIO_LOOPS.items():
        source = inspect.getsource(getattr(Queue, name))
        assert hashlib.sha256(source.encode()).hexdigest()[:16] == expected, f"{name}: {UPGRADED}"


def test_a_queued_blocks_holds_the_queue_quieten_swaps() -> None:
    with gr.Blocks(analytics_enabled=False) as demo:
        gr.Textbox()
    demo.queue()
    assert type(getattr(demo, "_queue", None)) is Queue, UPGRADED
    quieten(demo)
    assert isinstance(demo._queue, QuietQueue), UPGRADED


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid` so far (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_playground_spends_almost_no_cpu(tmp_path: Path) -> None:
    # No api behind it: with nobody on the page the playground asks it nothing.
    playground = launch_playground("http://127.0.0.1:9", tmp_path, free_port())
    try:
        time.sleep(3)  # start-up work (imports, first requests) is over
        pid = playground.process.pid
        before, start = cpu_seconds(pid), time.monotonic()
        time.sleep(10)
        share = (cpu_seconds(pid) - before) / (time.monotonic() - start)
    finally:
        playground.stop()
    # gradio's own queue used ~5% of a core here (a 1 ms poll); waiting for work, ~0.2% on a
    # quiet machine. What is left is uvicorn's 10 Hz tick and gradio's 10 Hz launch loop (py-spy),
    # 1.1-1.7% of a core in a slow hour of a shared machine: the bound sits between the two.
    assert share < 0.025, f"idle playground used {share:.1%} of a core"


@pytest.fixture
def slow_app() -> Iterator[str]:
    """A page whose one event runs one at a time and takes a moment: a second and third click
    wait for the first to end, the case where gradio polls for a free slot."""

    async def slow(text: str) -> str:
        await asyncio.sleep(0.3)
        return text.upper()

    with gr.Blocks(analytics_enabled=False) as demo:
        box, out = gr.Textbox(), gr.Textbox()
        box.submit(slow, box, out, api_name="slow", concurrency_limit=1)
    demo.queue()
    quieten(demo)
    assert isinstance(demo._queue, QuietQueue)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port())
    try:
        yield demo.local_url
    finally:
        demo.close()


def test_queued_events_run_when_a_slot_frees(slow_app: str) -> None:
    client = Client(slow_app, verbose=False)
    try:
        jobs = [client.submit(word, api_name="/slow") for word in ("a", "b", "c")]
        assert [job.result(timeout=30) for job in jobs] == ["A", "B", "C"]
        # And again after the queue has gone idle: the first push wakes it.
        time.sleep(0.5)
        assert client.predict("d", api_name="/slow") == "D"
    finally:
        client.close()
