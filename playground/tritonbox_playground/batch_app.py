"""The Batch tab's events: start a batch from an uploaded file, watch it (progress and the time
left, polled from the api), cancel it, and offer its results (batch_tab.py has the components).

The batch is the api's: closing the page stops only the watching, never the batch, and pasting
its id in "Batch id" (Follow) watches it again.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import gradio as gr

from tritonbox_playground import batch_client, display
from tritonbox_playground.api_client import ApiClient, PlaygroundError
from tritonbox_playground.batch_client import BatchView
from tritonbox_playground.batch_csv import DEFAULT_MAX_LINES, batch_input
from tritonbox_playground.batch_results import progress, result_rows, results_csv, table
from tritonbox_playground.batch_tab import BATCH_FIELDS, BatchLayout
from tritonbox_playground.form import plain_error
from tritonbox_playground.layout_parts import named
from tritonbox_playground.runs import ActiveRuns, session_of

POLL_S = 1.0  # one GET of a small object a second per watching page
MAX_POLL_FAILURES = 30  # the api away this many polls in a row (about 6 min): stop watching
TABLE_ROWS = 200  # the page shows these; the downloads hold every row
# The events' outputs, in order; frame() fills the ones named, the others are left as they are.
OUTPUT_NAMES = ("status", "progress", "batch_id", "results", "csv", "jsonl", "errors")
BATCH_ID = re.compile(r"^batch_[A-Za-z0-9_-]{1,100}$")
_STATUS = {
    "validating": "**Checking the file…**",
    "in_progress": "**Running…**",
    "finalizing": "**Writing the results…**",
    "cancelling": "**Cancelling…** Running lines stop; what finished is kept.",
    "cancelled": "**Cancelled.** What finished is kept below.",
    "expired": "**Expired:** its completion window ended before every line ran.",
}


def status_line(batch: BatchView) -> str:
    counts = batch.request_counts
    if batch.status == "completed":
        head = f"**Done:** {counts.completed:,} answered, {counts.failed:,} failed."
    elif batch.status == "failed":
        head = display.error("; ".join(batch.problems()) or "the batch failed")
    else:
        head = _STATUS.get(batch.status, f"**{display.escape(batch.status)}…**")
    return f"{head} (batch `{batch.id}`)"


def _write(folder: Path, name: str, content: str | bytes) -> str:
    path = folder / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return str(path)


def wire_batch(batch: BatchLayout, run_form: list[Any], api: ApiClient, public_url: str) -> None:
    """Register the tab's events; call inside `gr.Blocks()`. `run_form`: the Run tab's controls
    in BATCH_FIELDS order (copied by "Use the settings of …"); `public_url`: the api's address
    as people reach it, for each row's permalink."""
    watchers = ActiveRuns()  # a session's newest watch: an older one stops at its next poll
    downloads = [batch.csv_download, batch.jsonl_download, batch.errors_download]
    outputs = [batch.status, batch.progress, batch.batch_id, batch.results, *downloads]

    def frame(**values: Any) -> list[Any]:
        return [values.get(name, gr.skip()) for name in OUTPUT_NAMES]

    def cleared(status: str) -> list[Any]:
        hidden = gr.DownloadButton(visible=False)
        return frame(
            status=status, progress="", results=[], csv=hidden, jsonl=hidden, errors=hidden
        )

    async def finished(ended: BatchView) -> list[Any]:
        """The results table and the downloads of an ended batch."""
        try:
            asked = await batch_client.content(api, ended.input_file_id)
        except PlaygroundError:
            asked = b""  # the input file was deleted: the rows only lack their prompts
        answers = await batch_client.content(api, ended.output_file_id)
        errors = await batch_client.content(api, ended.error_file_id)
        rows = result_rows(asked, answers, errors, public_url)
        # One folder per batch (following it again overwrites it), copied into gradio's cache.
        folder = Path(tempfile.gettempdir()) / "tritonbox-batches" / ended.id
        folder.mkdir(parents=True, exist_ok=True)
        csv_path = await asyncio.to_thread(_write, folder, f"{ended.id}.csv", results_csv(rows))
        shown = len(rows) > TABLE_ROWS
        note = f" The table shows the first {TABLE_ROWS:,} rows; the CSV has all." if shown else ""
        return frame(
            status=status_line(ended) + note,
            results=table(rows, TABLE_ROWS),
            csv=gr.DownloadButton(value=csv_path, visible=True),
            jsonl=gr.DownloadButton(
                value=_write(folder, f"{ended.id}_output.jsonl", answers), visible=bool(answers)
            ),
            errors=gr.DownloadButton(
                value=_write(folder, f"{ended.id}_errors.jsonl", errors), visible=bool(errors)
            ),
        )

    async def watch(request: gr.Request | None, batch_id: str) -> AsyncIterator[list[Any]]:
        session = session_of(request)
        handle = watchers.begin(session)
        failures, current = 0, None
        try:
            while watchers.get(session) is handle:
                try:
                    current = await batch_client.get(api, batch_id)
                except PlaygroundError as failure:
                    failures += 1
                    if failure.status_code == 404 or failures >= MAX_POLL_FAILURES:
                        yield frame(status=display.error(failure.message))
                        return
                    yield frame(status=display.error(f"{failure.message} (asking again)"))
                    await asyncio.sleep(POLL_S * min(failures, 16))
                    continue
                failures = 0
                yield frame(status=status_line(current), progress=progress(current, time.time()))
                if current.ended:
                    yield await finished(current)
                    return
                await asyncio.sleep(POLL_S)
        except PlaygroundError as failure:  # reading the ended batch's files
            yield frame(status=display.error(f"The results could not be read: {failure.message}"))
        finally:
            watchers.end(session, handle)

    async def start(
        request: gr.Request, path: str | None, *values: Any
    ) -> AsyncIterator[list[Any]]:
        if not path:
            yield frame(status=display.hint("Choose a CSV or JSONL file first: nothing was sent."))
            return
        settings = dict(zip(BATCH_FIELDS, values, strict=True))
        yield cleared("**Reading the file…**")
        try:
            limits = await api.limits()
            most = limits.max_batch_lines or DEFAULT_MAX_LINES
            content = await asyncio.to_thread(batch_input, path, settings, limits.model, most)
            name = Path(path).stem + ".jsonl"
            file_id = await batch_client.upload(api, name, content)
            made = await batch_client.create(api, file_id, {"source": "playground", "file": name})
        except PlaygroundError as failure:
            yield frame(status=display.error(plain_error(failure.message)))
            return
        yield frame(
            status=status_line(made), batch_id=made.id, progress=progress(made, time.time())
        )
        async for shown in watch(request, made.id):
            yield shown

    async def follow(request: gr.Request, batch_id: str) -> AsyncIterator[list[Any]]:
        wanted = (batch_id or "").strip()
        if not BATCH_ID.match(wanted):
            yield frame(status=display.hint("Paste a batch id (it starts with `batch_`) first."))
            return
        yield cleared("**Asking the api…**")
        async for shown in watch(request, wanted):
            yield shown

    async def cancel(batch_id: str) -> str:
        wanted = (batch_id or "").strip()
        if not BATCH_ID.match(wanted):
            return display.hint("No batch to cancel: start one (or paste its id) first.")
        try:
            return status_line(await batch_client.cancel(api, wanted))
        except PlaygroundError as failure:
            return display.error(f"Cancel: {failure.message}")

    # No concurrency limit: a watcher mostly sleeps between polls, and a long batch must not
    # keep other people's pages from watching theirs (the api limits uploads per key).
    batch.start.click(
        named(start, ("request", "path"), BATCH_FIELDS),
        inputs=[batch.upload, *batch.form],
        outputs=outputs,
        api_name="batch_start",
        concurrency_limit=None,
    )
    gr.on(
        [batch.follow.click, batch.batch_id.submit],
        follow,
        inputs=batch.batch_id,
        outputs=outputs,
        api_name="batch_follow",
        concurrency_limit=None,
    )
    # Cancel must not wait behind the watchers: no concurrency limit of its own.
    batch.cancel.click(
        cancel, inputs=batch.batch_id, outputs=batch.status, api_name="batch_cancel",
        concurrency_limit=None,
    )  # fmt: skip
    batch.copy_settings.click(
        lambda *values: list(values), inputs=run_form, outputs=batch.form,
        api_visibility="private", show_progress="hidden",
    )  # fmt: skip
