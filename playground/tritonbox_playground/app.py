"""The playground page: gr.Blocks layout and event wiring. Everything it knows about
predictions it asks the api (ApiClient); it holds no model and no database."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import gradio as gr

from tritonbox_api import parameters as p
from tritonbox_playground import display, snippets
from tritonbox_playground.api_client import ApiClient, PlaygroundError, Prediction, Started
from tritonbox_playground.form import (
    CHAT_MODE,
    FIELDS,
    INTEGERS,
    LABELS,
    MAIN_NUMBERS,
    MODES,
    MORE_NUMBERS,
    PROMPT_MODE,
    WORD_LISTS,
    from_prediction,
    generation_input,
    hint,
)
from tritonbox_playground.runs import ActiveRuns
from tritonbox_playground.settings import PlaygroundSettings

RECENT_LIMIT = 20
ALL_SOURCES = "all"

EXAMPLES = [
    # mode, system prompt, prompt, max tokens, temperature, stop words, bad words
    [PROMPT_MODE, "", "The capital of France is", 16, 0.0, ".", ""],
    [CHAT_MODE, "Answer in one short sentence.", "What is the capital of France?", 24, 0.0, "", ""],
    [CHAT_MODE, "You are a friendly poet.", "Write a haiku about the sea.", 48, 0.8, "", ""],
    [PROMPT_MODE, "", "Three fruits that are red:", 24, 0.0, "\\n", "cherry"],
]


def _number_control(parameter: p.Parameter) -> gr.components.Component:
    common: dict[str, Any] = {
        "label": LABELS[parameter.name],
        "info": hint(parameter),
        "elem_id": parameter.name,
    }
    if parameter.name not in INTEGERS and parameter.ge is not None and parameter.le is not None:
        return gr.Slider(
            minimum=parameter.ge, maximum=parameter.le, value=parameter.default, step=0.01, **common
        )
    return gr.Number(
        value=parameter.default,
        minimum=parameter.ge,
        maximum=parameter.le,
        precision=0 if parameter.name in INTEGERS else None,
        **common,
    )


def _earlier_note(earlier: Sequence[dict[str, str]]) -> Any:
    if not earlier:
        return gr.Markdown("", label="Earlier messages", visible=False)
    return gr.Markdown(
        f"This chat has {len(earlier)} earlier message(s) from the prediction you opened; "
        "they are sent again before your message (**New chat** forgets them).",
        label="Earlier messages",
        visible=True,
    )


def _named(fn: Callable[..., Any], *leading: str) -> Callable[..., Any]:
    """`fn(*leading, *values)` shown with one named parameter per form field, so gradio_client
    and the page's API docs say `prompt=`, `max_tokens=`, … instead of param_1, param_2, …"""
    signature = inspect.signature(fn)
    first = [signature.parameters[name] for name in leading]
    fields = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in FIELDS]
    fn.__signature__ = signature.replace(parameters=[*first, *fields])  # type: ignore[attr-defined]
    return fn


def _session(request: gr.Request | None) -> str:
    # gradio_client and browsers both have a session hash; a missing one shares a slot.
    return (request.session_hash if request is not None else None) or "anonymous"


def create_app(settings: PlaygroundSettings, client: ApiClient | None = None) -> gr.Blocks:
    api = client or ApiClient(
        settings.api_url,
        api_key=settings.api_key.get_secret_value() if settings.api_key else None,
        timeout_s=settings.playground_api_timeout_s,
        max_connections=settings.playground_concurrency * 2 + 16,
    )
    runs = ActiveRuns()
    api_url = settings.shown_api_url
    key_required = settings.api_key is not None

    with gr.Blocks(title="TritonBox playground", analytics_enabled=False) as demo:
        gr.Markdown(
            "# TritonBox playground\n"
            "Try a prompt, tune how the model answers, and share the result: every run is "
            "saved with a permalink."
        )
        earlier = gr.State([])
        # Any: gradio adds the event methods (.change, .submit) at run time.
        controls: dict[str, Any] = {}
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                controls["mode"] = gr.Radio(
                    list(MODES),
                    value=PROMPT_MODE,
                    label="Mode",
                    info="Prompt: the model continues your text. Chat: it answers your "
                    "message as an assistant, following the system prompt.",
                    elem_id="mode",
                )
                controls["system_prompt"] = gr.Textbox(
                    "",
                    label="System prompt",
                    lines=2,
                    visible=False,
                    placeholder="How the assistant should behave, e.g. 'Answer in one sentence.'",
                    elem_id="system_prompt",
                )
                controls["prompt"] = gr.Textbox(
                    "",
                    label="Prompt",
                    lines=6,
                    placeholder="Write the text the model should continue…",
                    elem_id="prompt",
                )
                with gr.Row():
                    earlier_note = _earlier_note([])
                    new_chat = gr.Button("New chat", size="sm", visible=False)
                with gr.Row():
                    run_button = gr.Button("Run", variant="primary", elem_id="run")
                    stop_button = gr.Button("Stop", variant="stop", elem_id="stop")
                answer = gr.Textbox(
                    label="Answer", lines=8, interactive=False, buttons=["copy"], elem_id="answer"
                )
                result = gr.Markdown(label="Result", elem_id="result")
                prediction_id = gr.Textbox(label="Prediction id", visible=False)
            with gr.Column(scale=2):
                for parameter in MAIN_NUMBERS:
                    controls[parameter.name] = _number_control(parameter)
                controls[p.SEED.name] = gr.Textbox(
                    "",
                    label=LABELS[p.SEED.name],
                    info=hint(p.SEED),
                    placeholder="random",
                    elem_id=p.SEED.name,
                )
                for parameter in WORD_LISTS:
                    controls[parameter.name] = gr.Textbox(
                        "",
                        label=LABELS[parameter.name],
                        info=hint(parameter, " One per line; write \\n for a line break."),
                        lines=3,
                        elem_id=parameter.name,
                    )
                with gr.Accordion("More settings", open=False):
                    for parameter in MORE_NUMBERS:
                        controls[parameter.name] = _number_control(parameter)
        form = [controls[name] for name in FIELDS]

        gr.Examples(
            examples=EXAMPLES,
            inputs=[
                controls["mode"],
                controls["system_prompt"],
                controls["prompt"],
                controls[p.MAX_TOKENS.name],
                controls[p.TEMPERATURE.name],
                controls[p.STOP_WORDS.name],
                controls[p.BAD_WORDS.name],
            ],
            label="Examples (click one, then Run)",
        )

        with gr.Accordion("Copy as curl / Python / openai", open=False):
            gr.Markdown(
                "The current settings as code that asks the api the same"
                + (" (set `API_KEY` in your environment first)." if key_required else ".")
            )
            with gr.Tabs():
                with gr.Tab("curl"):
                    curl_code = gr.Code(
                        language="shell", label="curl", buttons=["copy"], elem_id="curl"
                    )
                with gr.Tab("Python"):
                    python_code = gr.Code(
                        language="python",
                        label="Python (httpx)",
                        buttons=["copy"],
                        elem_id="python",
                    )
                with gr.Tab("openai"):
                    openai_code = gr.Code(
                        language="python", label="openai SDK", buttons=["copy"], elem_id="openai"
                    )

        with gr.Accordion("Recent predictions", open=True):
            with gr.Row():
                recent_source = gr.Radio(
                    [("Playground runs", "playground"), ("All", ALL_SOURCES)],
                    value="playground",
                    label="Show",
                    scale=3,
                )
                refresh = gr.Button("Refresh", size="sm", scale=1)
            recent = gr.Dataframe(
                headers=display.RECENT_HEADERS,
                datatype="str",
                interactive=False,
                wrap=True,
                elem_id="recent",
                label="Click a row to open it",
            )
            with gr.Row():
                open_id = gr.Textbox(
                    label="Open a prediction",
                    placeholder="a prediction id or permalink",
                    scale=4,
                    elem_id="open_id",
                )
                open_button = gr.Button("Open", size="sm", scale=1)

        # ---- events -------------------------------------------------------------------------

        restore_outputs = [*form, earlier, earlier_note, new_chat, answer, result, prediction_id]

        def restored(prediction: Prediction) -> list[Any]:
            state = from_prediction(prediction)
            note = _earlier_note(state.earlier)
            return [
                *(state.values[name] for name in FIELDS),
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
            handle = runs.begin(_session(request))
            text, current = "", ""
            try:
                body = generation_input(dict(zip(FIELDS, values, strict=True)), earlier_messages)
                yield "", display.running(None), ""
                async with contextlib.aclosing(api.stream_prediction(body)) as events:
                    async for event in events:
                        if isinstance(event, Started):
                            current = handle.prediction_id = event.id
                            if handle.stop_requested:  # Stop came before the id
                                await api.cancel(event.id)
                            yield text, display.running(current), current
                        elif isinstance(event, str):
                            text += event
                            yield text, display.running(current), current
                        else:
                            yield event.output, display.outcome(event), event.id
            except PlaygroundError as failure:
                yield text, display.error(failure.message), current
            finally:
                runs.end(_session(request), handle)

        async def stop(request: gr.Request) -> None:
            handle = runs.get(_session(request))
            if handle is None:
                gr.Info("Nothing is running.")
                return
            handle.stop_requested = True
            if handle.prediction_id is None:
                return  # the run cancels itself when the api tells it the id
            try:
                await api.cancel(handle.prediction_id)
            except PlaygroundError as failure:
                gr.Warning(f"Stop: {failure.message}")

        def code(*values: Any) -> tuple[str, str, str]:
            try:
                body = generation_input(dict(zip(FIELDS, values, strict=True)))
            except PlaygroundError as failure:
                message = f"# {failure.message}"
                return message, message, message
            return (
                snippets.curl(body, api_url, api_key_required=key_required),
                snippets.python(body, api_url, api_key_required=key_required),
                snippets.openai(body, api_url, api_key_required=key_required),
            )

        def switch_mode(mode: str) -> tuple[Any, Any]:
            chat = mode == CHAT_MODE
            return (
                gr.Textbox(visible=chat),
                gr.Textbox(
                    label="Your message" if chat else "Prompt",
                    placeholder="Write your message to the assistant…"
                    if chat
                    else "Write the text the model should continue…",
                ),
            )

        def forget_earlier() -> tuple[list[dict[str, str]], Any, Any]:
            return [], _earlier_note([]), gr.Button(visible=False)

        # Only the button runs: Enter in the prompt box is a line break, as people expect there.
        run_event = run_button.click(
            _named(run, "request", "earlier_messages"),
            inputs=[earlier, *form],
            outputs=[answer, result, prediction_id],
            api_name="run",
            show_progress="minimal",
        )
        run_event.then(list_recent, inputs=recent_source, outputs=recent, api_visibility="private")
        # Stop must not wait behind running generations: no concurrency limit of its own.
        stop_button.click(stop, api_name="stop", concurrency_limit=None, show_progress="hidden")

        gr.on(
            [control.change for control in form],
            _named(code),
            inputs=form,
            outputs=[curl_code, python_code, openai_code],
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
            forget_earlier, outputs=[earlier, earlier_note, new_chat], api_visibility="private"
        )
        gr.on(
            [refresh.click, recent_source.change],
            list_recent,
            inputs=recent_source,
            outputs=recent,
            api_name="recent",
            concurrency_limit=None,
        )
        recent.select(open_row, outputs=restore_outputs, api_visibility="private")
        gr.on(
            [open_button.click, open_id.submit],
            open_prediction,
            inputs=open_id,
            outputs=restore_outputs,
            api_name="open_prediction",
            concurrency_limit=None,
        )
        demo.load(open_from_url, outputs=restore_outputs, api_visibility="private")
        demo.load(
            _named(code),
            inputs=form,
            outputs=[curl_code, python_code, openai_code],
            api_visibility="private",
        )
        demo.load(list_recent, inputs=recent_source, outputs=recent, api_visibility="private")
    demo.queue(default_concurrency_limit=settings.playground_concurrency)
    return demo
