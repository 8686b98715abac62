"""The playground page's events: run, stop, open, list, snippets (the components are in
layout.py). Everything it knows about predictions it asks the api (ApiClient); it holds no model
and no database."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import gradio as gr

from tritonbox_common import snippets
from tritonbox_playground import display
from tritonbox_playground.adapters import ADAPTER, listed_sha256
from tritonbox_playground.adapters import restored as restored_adapter
from tritonbox_playground.api_client import (
    ApiClient,
    PlaygroundError,
    PredictionView,
    RunStarted,
)
from tritonbox_playground.batch_app import wire_batch
from tritonbox_playground.batch_tab import BATCH_FIELDS
from tritonbox_playground.compare_app import wire_compare
from tritonbox_playground.form import (
    FIELDS,
    from_prediction,
    generation_input,
    missing_prompt,
    plain_error,
)
from tritonbox_playground.layout import ALL_SOURCES, build_layout, earlier_note
from tritonbox_playground.layout_parts import named, switch_mode
from tritonbox_playground.page_load import wire_page_load
from tritonbox_playground.quiet_queue import quieten
from tritonbox_playground.runs import ActiveRuns, session_of, stop_run
from tritonbox_playground.settings import PlaygroundSettings

RECENT_LIMIT = 20


def _named(fn: Callable[..., Any], *leading: str) -> Callable[..., Any]:
    return named(fn, leading, FIELDS)


def create_app(settings: PlaygroundSettings, client: ApiClient | None = None) -> gr.Blocks:
    api = client or ApiClient(
        settings.api_url,
        api_key=settings.sent_api_key,
        timeout_s=settings.playground_api_timeout_s,
        max_connections=settings.playground_concurrency * 2 + 16,
    )
    runs = ActiveRuns()
    api_url = settings.shown_api_url
    key_required = settings.sent_api_key is not None

    with gr.Blocks(title="TritonBox playground", analytics_enabled=False) as demo:
        page = build_layout(key_required=key_required)
        controls, form = page.controls, page.form
        earlier, new_chat, answer, result = page.earlier, page.new_chat, page.answer, page.result
        prediction_id, recent, recent_source = page.prediction_id, page.recent, page.recent_source
        snippet_boxes = [page.curl_code, page.python_code, page.openai_code]

        restore_outputs = [
            *form,
            earlier,
            page.earlier_note,
            new_chat,
            answer,
            result,
            prediction_id,
        ]

        def restored(prediction: PredictionView) -> list[Any]:
            state = from_prediction(prediction)
            note = earlier_note(state.earlier)
            return [
                *(
                    restored_adapter(state.values[name]) if name == ADAPTER else state.values[name]
                    for name in FIELDS
                ),
                state.earlier,
                note,
                gr.Button(visible=bool(state.earlier)),
                prediction.output,
                display.outcome(prediction),
                prediction.id,
            ]

        def unchanged(message: str | None = None) -> list[Any]:
            kept = [gr.skip() for _ in restore_outputs]
            if message is not None:
                kept[restore_outputs.index(result)] = display.error(message)
            return kept

        async def open_prediction(reference: str) -> list[Any]:
            """Load a prediction (id or permalink) into the form, ready to run again."""
            prediction_ref = reference.strip().rstrip("/").rsplit("/", 1)[-1]
            prediction_ref = prediction_ref.removeprefix("?p=")
            if not prediction_ref:
                return unchanged()
            try:
                return restored(await api.get(prediction_ref))
            except PlaygroundError as failure:
                return unchanged(failure.message)

        async def open_from_url(request: gr.Request) -> list[Any]:
            # `/?p=<id>`: the permalink page's "open in playground" link.
            reference = request.query_params.get("p") if request is not None else None
            return await open_prediction(reference or "")

        async def open_row(event: gr.SelectData) -> list[Any]:
            row = event.row_value
            if not row or not row[-1]:
                return unchanged()
            return await open_prediction(str(row[-1]))

        async def list_recent(source: str) -> list[list[str]]:
            try:
                predictions = await api.list(
                    limit=RECENT_LIMIT, source=None if source == ALL_SOURCES else source
                )
            except PlaygroundError as failure:
                gr.Warning(f"Recent predictions: {failure.message}")
                return []
            return [display.recent_row(prediction) for prediction in predictions]

        async def run(
            request: gr.Request, earlier_messages: list[dict[str, str]], *values: Any
        ) -> AsyncIterator[tuple[str, str, str]]:
            values_by_name = dict(zip(FIELDS, values, strict=True))
            missing = missing_prompt(values_by_name)
            if missing:  # nothing to send: say so next to Run, and send nothing
                yield "", display.hint(missing), ""
                return
            handle = runs.begin(session_of(request))
            text, current = "", ""
            try:
                body = generation_input(values_by_name, earlier_messages)
                yield "", display.running(None), ""
                async with contextlib.aclosing(api.stream_prediction(body)) as events:
                    async for event in events:
                        if isinstance(event, RunStarted):
                            current = event.id
                            handle.prediction_ids.append(current)
                            if handle.stop_requested:  # Stop came before the id
                                await api.cancel(event.id)
                            yield text, display.running(current), current
                        elif isinstance(event, str):
                            text += event
                            yield text, display.running(current), current
                        else:
                            yield event.output, display.outcome(event), event.id
            except PlaygroundError as failure:
                yield text, display.error(plain_error(failure.message)), current
            finally:
                runs.end(session_of(request), handle)

        async def stop(request: gr.Request) -> None:
            problems = await stop_run(runs.get(session_of(request)), api.cancel)
            if problems is None:
                gr.Info("Nothing is running.")
            for problem in problems or []:
                gr.Warning(f"Stop: {problem}")

        async def code(*values: Any) -> tuple[str, str, str]:
            try:
                body = generation_input(dict(zip(FIELDS, values, strict=True)))
            except PlaygroundError as failure:
                message = f"# {failure.message}"
                return message, message, message
            sha = await listed_sha256(api, body)
            return (
                snippets.curl(body, api_url, api_key_required=key_required, adapter_sha256=sha),
                snippets.python(body, api_url, api_key_required=key_required, adapter_sha256=sha),
                snippets.openai(body, api_url, api_key_required=key_required, adapter_sha256=sha),
            )

        def forget_earlier() -> tuple[list[dict[str, str]], Any, Any]:
            return [], earlier_note([]), gr.Button(visible=False)

        # Only the button runs: Enter in the prompt box is a line break, as people expect there.
        run_event = page.run_button.click(
            _named(run, "request", "earlier_messages"),
            inputs=[earlier, *form],
            outputs=[answer, result, prediction_id],
            api_name="run",
            show_progress="minimal",
        )
        # Stop must not wait behind running generations: no concurrency limit of its own.
        page.stop_button.click(
            stop, api_name="stop", concurrency_limit=None, show_progress="hidden"
        )

        gr.on(
            [control.change for control in form],
            _named(code),
            inputs=form,
            outputs=snippet_boxes,
            api_name="snippets",
            trigger_mode="always_last",
            concurrency_limit=None,
            show_progress="hidden",
        )
        controls["mode"].change(
            switch_mode,
            inputs=controls["mode"],
            outputs=[controls["system_prompt"], controls["prompt"]],
            api_visibility="private",
            concurrency_limit=None,
            show_progress="hidden",
        )
        new_chat.click(
            forget_earlier, outputs=[earlier, page.earlier_note, new_chat], api_visibility="private"
        )
        gr.on(
            [page.refresh.click, recent_source.change],
            list_recent,
            inputs=recent_source,
            outputs=recent,
            api_name="recent",
            concurrency_limit=None,
        )
        recent.select(open_row, outputs=restore_outputs, api_visibility="private")
        gr.on(
            [page.open_button.click, page.open_id.submit],
            open_prediction,
            inputs=page.open_id,
            outputs=restore_outputs,
            api_name="open_prediction",
            concurrency_limit=None,
        )
        demo.load(open_from_url, outputs=restore_outputs, api_visibility="private")
        demo.load(
            _named(code),
            inputs=form,
            outputs=snippet_boxes,
            api_visibility="private",
        )
        demo.load(list_recent, inputs=recent_source, outputs=recent, api_visibility="private")

        for ran in (run_event, wire_compare(page.compare, api, runs)):
            ran.then(list_recent, inputs=recent_source, outputs=recent, api_visibility="private")
        wire_page_load(demo, page, api)
        wire_batch(page.batch, [controls[name] for name in BATCH_FIELDS], api, api_url)
    demo.queue(default_concurrency_limit=settings.playground_concurrency)
    quieten(demo)  # no 1 ms poll while idle: quiet_queue.py says why
    return demo
