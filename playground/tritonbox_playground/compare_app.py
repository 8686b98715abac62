"""The Compare tab's events: run every setting at once, stop them, fill a preset, and reopen a
shared comparison from `?compare=<id>,<id>` (components in compare_layout.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import gradio as gr

from tritonbox_common import parameters as p
from tritonbox_playground import display
from tritonbox_playground.adapters import ADAPTER
from tritonbox_playground.adapters import restored as restored_adapter
from tritonbox_playground.api_client import ApiClient, PlaygroundError, PredictionView, RunStarted
from tritonbox_playground.compare import (
    COLUMN_FIELDS,
    COLUMNS,
    SHARED,
    column_result,
    differences,
    parse_ids,
    restored,
    share_query,
    stream_together,
    with_shared_seed,
)
from tritonbox_playground.compare_layout import PRESETS, CompareLayout
from tritonbox_playground.form import generation_input, missing_prompt, plain_error
from tritonbox_playground.layout_parts import named, switch_mode
from tritonbox_playground.runs import ActiveRuns, session_of, stop_run

# The page's own address is known only to the browser: it turns `?compare=…` into a full link.
ABSOLUTE_LINK_JS = "(link) => link && link.startsWith('?') ? "
ABSOLUTE_LINK_JS += "window.location.origin + window.location.pathname + link : link"


def _named(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The compare event's inputs for gradio_client: prompt=…, a_temperature=…, third=…"""
    names = [*SHARED]
    names += [f"{label.lower()}_{name}" for label in COLUMNS for name in COLUMN_FIELDS]
    return named(fn, ("request",), [*names, "third"])


def _split(values: tuple[Any, ...]) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
    shared = dict(zip(SHARED, values[: len(SHARED)], strict=True))
    rest = values[len(SHARED) : -1]
    size = len(COLUMN_FIELDS)
    columns = [
        dict(zip(COLUMN_FIELDS, rest[i * size : (i + 1) * size], strict=True))
        for i in range(len(COLUMNS))
    ]
    return shared, columns, bool(values[-1])


def _filler(values: list[Any]) -> Callable[[], list[Any]]:
    def fill() -> list[Any]:
        return values

    return fill


class Board:
    """What the tab shows while a comparison runs: one answer and one result per column."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.texts = [""] * len(COLUMNS)
        self.results = [""] * len(COLUMNS)
        self.share, self.link = "", ""

    def outputs(self) -> list[str]:
        return [*self.texts, *self.results, self.share, self.link]

    def finish(self, finals: dict[int, PredictionView]) -> None:
        done = [finals[index] for index in range(self.count) if index in finals]
        if len(done) == self.count:
            for index, differs in enumerate(differences(done)):
                self.results[index] = column_result(COLUMNS[index], done[index], differs)
        if done:
            query = share_query([prediction.id for prediction in done])
            self.share = (
                f"**Share this comparison:** [this link]({query}) reopens these {len(done)} "
                "answers with their settings, ready to run again."
            )
            self.link = query


def compare_outputs(layout: CompareLayout) -> list[Any]:
    """What a comparison shows, in Board.outputs() order."""
    return [*layout.answers, *layout.results, layout.share, layout.link]


def wire_compare(layout: CompareLayout, api: ApiClient, runs: ActiveRuns) -> Any:
    """Wire the tab's events; returns its run event (to refresh the recent list after it)."""
    outputs = compare_outputs(layout)

    async def run(request: gr.Request, *values: Any) -> AsyncIterator[list[str]]:
        shared, columns, third = _split(values)
        board = Board(3 if third else 2)
        missing = missing_prompt(shared)
        if missing:
            board.results[0] = display.hint(missing)
            yield board.outputs()
            return
        columns = with_shared_seed(columns[: board.count])
        bodies = []
        for index, column in enumerate(columns):
            try:
                bodies.append(generation_input({**shared, **column}))
            except PlaygroundError as failure:
                board.results[index] = display.error(failure.message)
        if len(bodies) < board.count:
            yield board.outputs()  # one setting is wrong: nothing was sent
            return
        key = f"{session_of(request)}/compare"
        handle = runs.begin(key)
        finals: dict[int, PredictionView] = {}
        board.results[: board.count] = [display.running(None)] * board.count
        yield board.outputs()
        try:
            async for index, event in stream_together(api, bodies):
                if isinstance(event, RunStarted):
                    handle.prediction_ids.append(event.id)
                    if handle.stop_requested:
                        await api.cancel(event.id)
                    board.results[index] = display.running(event.id)
                elif isinstance(event, str):
                    board.texts[index] += event
                elif isinstance(event, PlaygroundError):
                    board.results[index] = display.error(plain_error(event.message))
                else:
                    finals[index] = event
                    board.texts[index] = event.output
                    board.results[index] = display.outcome(event)
                yield board.outputs()
            board.finish(finals)
            yield board.outputs()
        finally:
            runs.end(key, handle)

    async def stop(request: gr.Request) -> None:
        problems = await stop_run(runs.get(f"{session_of(request)}/compare"), api.cancel)
        if problems is None:
            gr.Info("Nothing is running.")
        for problem in problems or []:
            gr.Warning(f"Stop: {problem}")

    run_event = layout.run_button.click(
        _named(run),
        inputs=layout.inputs,
        outputs=outputs,
        api_name="compare",
        show_progress="minimal",
    )
    run_event.then(None, inputs=layout.link, outputs=layout.link, js=ABSOLUTE_LINK_JS)
    layout.stop_button.click(
        stop, api_name="stop_compare", concurrency_limit=None, show_progress="hidden"
    )

    def show_third(third: bool) -> list[Any]:
        return [gr.Column(visible=third), gr.Column(visible=third)]

    layout.third.change(
        show_third,
        inputs=layout.third,
        outputs=[layout.settings_boxes[-1], layout.answer_boxes[-1]],
        api_visibility="private",
        show_progress="hidden",
    )

    layout.shared["mode"].change(
        switch_mode,
        inputs=layout.shared["mode"],
        outputs=[layout.shared["system_prompt"], layout.shared["prompt"]],
        api_visibility="private",
        show_progress="hidden",
    )

    a, b = layout.columns[:2]
    preset_outputs = [*(layout.shared[name] for name in SHARED), a[p.MAX_TOKENS.name]]
    preset_outputs += [b[p.MAX_TOKENS.name], layout.third]
    for column in (a, b):
        preset_outputs += [column[name] for name in (p.TEMPERATURE.name, p.STOP_WORDS.name)]
        preset_outputs.append(column[p.BAD_WORDS.name])
    for button, (_, mode, system, prompt, tokens, first, second) in zip(
        layout.presets, PRESETS, strict=True
    ):
        filled = [mode, system, prompt, tokens, tokens, False, *first, *second]
        button.click(_filler(filled), outputs=preset_outputs, api_visibility="private")

    return run_event


async def open_comparison(api: ApiClient, query: str | None) -> tuple[list[PredictionView], str]:
    """The predictions of `?compare=<ids>`, and a message when some could not be opened."""
    ids = parse_ids(query)
    found = await asyncio.gather(*(api.get(i) for i in ids), return_exceptions=True)
    predictions = [item for item in found if isinstance(item, PredictionView)]
    failures = [item for item in found if isinstance(item, PlaygroundError)]
    for item in found:
        if isinstance(item, BaseException) and not isinstance(item, PlaygroundError):
            raise item
    return predictions, "; ".join(failure.message for failure in failures)


def comparison_values(layout: CompareLayout, predictions: list[PredictionView]) -> dict[Any, Any]:
    """The tab filled with a shared comparison: prompt, each column's settings and answer."""
    shared, columns = restored(predictions)
    values: dict[Any, Any] = {layout.shared[name]: shared[name] for name in SHARED}
    values[layout.third] = len(predictions) > 2
    for column, settings in zip(layout.columns, columns, strict=False):
        values.update({column[name]: settings[name] for name in COLUMN_FIELDS})
        values[column[ADAPTER]] = restored_adapter(settings[ADAPTER])
    board = Board(len(predictions))
    for index, prediction in enumerate(predictions):
        board.texts[index] = prediction.output
    board.finish(dict(enumerate(predictions)))
    values.update(zip(compare_outputs(layout), board.outputs(), strict=True))
    return values
