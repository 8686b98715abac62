"""Controls that the Run and Compare tabs build alike, the names their events show, and the
list of recent predictions under both."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import gradio as gr

from tritonbox_common import parameters as p
from tritonbox_playground import display
from tritonbox_playground.form import (
    CHAT_MODE,
    INTEGERS,
    LABELS,
    MODES,
    PROMPT_MODE,
    hint,
    prompt_hint,
)

ALL_SOURCES = "all"


def number_control(parameter: p.Parameter, suffix: str = "", value: Any = None) -> Any:
    """A slider for a bounded decimal, a number box otherwise; `elem_id` is the parameter's
    name + `suffix` (the browser tests find controls by it)."""
    common: dict[str, Any] = {
        "label": LABELS[parameter.name],
        "info": hint(parameter),
        "elem_id": f"{parameter.name}{suffix}",
    }
    start = parameter.default if value is None else value
    if parameter.name not in INTEGERS and parameter.ge is not None and parameter.le is not None:
        return gr.Slider(
            minimum=parameter.ge, maximum=parameter.le, value=start, step=0.01, **common
        )
    return gr.Number(
        value=start,
        minimum=parameter.ge,
        maximum=parameter.le,
        precision=0 if parameter.name in INTEGERS else None,
        **common,
    )


def prompt_boxes(
    prefix: str, *, prompt_lines: int, system_lines: int, mode_info: str | None = None
) -> dict[str, Any]:
    """The mode radio, the prompt and the (chat-only) system prompt, as both tabs show them:
    `elem_id`s are `prefix` + mode, prompt, system_prompt (the browser tests find them by it)."""
    boxes: dict[str, Any] = {}
    boxes["mode"] = gr.Radio(
        list(MODES), value=PROMPT_MODE, label="Mode", info=mode_info, elem_id=f"{prefix}mode"
    )
    # The message comes first: in chat mode the box people write in is the first one.
    boxes["prompt"] = gr.Textbox(
        "",
        label="Prompt",
        lines=prompt_lines,
        placeholder="Write the text the model should continue…",
        info=prompt_hint(None),
        elem_id=f"{prefix}prompt",
    )
    boxes["system_prompt"] = gr.Textbox(
        "",
        label="System prompt (optional)",
        lines=system_lines,
        visible=False,
        placeholder="How the assistant should behave, e.g. 'Answer in one sentence.'",
        elem_id=f"{prefix}system_prompt",
    )
    return boxes


def named(
    fn: Callable[..., Any], leading: Sequence[str], names: Sequence[str]
) -> Callable[..., Any]:
    """`fn(*leading, *values)` shown with one named parameter per value, so gradio_client and
    the page's API docs say `prompt=`, `max_tokens=`, … instead of param_1, param_2, …"""
    signature = inspect.signature(fn)
    first = [signature.parameters[name] for name in leading]
    fields = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in names]
    fn.__signature__ = signature.replace(parameters=[*first, *fields])  # type: ignore[attr-defined]
    return fn


def switch_mode(mode: str) -> list[Any]:
    """(system prompt, prompt) as the mode needs them: a chat has a system prompt and a message."""
    chat = mode == CHAT_MODE
    return [
        gr.Textbox(visible=chat),
        gr.Textbox(
            label="Your message" if chat else "Prompt",
            placeholder="Write your message to the assistant…"
            if chat
            else "Write the text the model should continue…",
        ),
    ]


def recent_list() -> dict[str, Any]:
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
    return dict(
        recent_source=recent_source,
        refresh=refresh,
        recent=recent,
        open_id=open_id,
        open_button=open_button,
    )
