"""The playground page's components and where they sit; app.py wires their events.

Every control takes its name, default, limits and hint from tritonbox_common.parameters through
form.py, so the page always shows what the api enforces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr

from tritonbox_common import parameters as p
from tritonbox_playground import adapters
from tritonbox_playground.batch_tab import BatchLayout, build_batch
from tritonbox_playground.compare_layout import CompareLayout, build_compare
from tritonbox_playground.form import (
    CHAT_MODE,
    FIELDS,
    LABELS,
    MAIN_NUMBERS,
    MORE_NUMBERS,
    PROMPT_MODE,
    WORD_LISTS,
    hint,
)
from tritonbox_playground.json_output import JSON_HINT, JSON_OUTPUT
from tritonbox_playground.layout_parts import ALL_SOURCES, number_control, prompt_boxes, recent_list

__all__ = ["ALL_SOURCES", "Layout", "build_layout", "earlier_note"]

EXAMPLES = [
    # mode, system prompt, prompt, max tokens, temperature, stop words, bad words
    [PROMPT_MODE, "", "The capital of France is", 16, 0.0, ".", ""],
    [CHAT_MODE, "Answer in one short sentence.", "What is the capital of France?", 24, 0.0, "", ""],
    [CHAT_MODE, "You are a friendly poet.", "Write a haiku about the sea.", 48, 0.8, "", ""],
    [PROMPT_MODE, "", "Three fruits that are red:", 24, 0.0, "\\n", "cherry"],
]


def earlier_note(earlier: Sequence[dict[str, str]]) -> Any:
    if not earlier:
        return gr.Markdown("", label="Earlier messages", visible=False)
    return gr.Markdown(
        f"This chat has {len(earlier)} earlier message(s) from the prediction you opened; "
        "they are sent again before your message (**New chat** forgets them).",
        label="Earlier messages",
        visible=True,
    )


@dataclass
class Layout:
    """The components the events read and write. Any: gradio adds the event methods
    (.click, .change, .submit) at run time."""

    controls: dict[str, Any]
    adapter_note: Any
    earlier: Any
    earlier_note: Any
    new_chat: Any
    run_button: Any
    stop_button: Any
    answer: Any
    result: Any
    prediction_id: Any
    curl_code: Any
    python_code: Any
    openai_code: Any
    recent_source: Any
    refresh: Any
    recent: Any
    open_id: Any
    open_button: Any
    tabs: Any
    compare: CompareLayout
    batch: BatchLayout

    @property
    def form(self) -> list[Any]:
        """The form's controls in FIELDS order: every event's inputs and restore's outputs."""
        return [self.controls[name] for name in FIELDS]


def build_layout(*, key_required: bool) -> Layout:
    """Create the page's components; call inside `gr.Blocks()`."""
    gr.Markdown(
        "# TritonBox playground\n"
        "Try a prompt, see how the settings change the answer, and share the result: every "
        "run is saved with a permalink. **Compare settings** runs two or three settings side "
        "by side; **Batch** runs a whole file of prompts."
    )
    earlier = gr.State([])
    # Any: gradio adds the event methods (.change, .submit) at run time.
    controls: dict[str, Any] = {}
    with gr.Tabs() as tabs:
        with gr.Tab("Try a prompt", id="run"):
            parts = _run_tab(controls, key_required=key_required)
        with gr.Tab("Compare settings", id="compare", elem_id="compare_tab"):
            compare = build_compare()
        with gr.Tab("Batch", id="batch", elem_id="batch_tab"):
            batch = build_batch()
    recent_parts = recent_list()
    return Layout(controls=controls, earlier=earlier, tabs=tabs, compare=compare, batch=batch,
                  **parts, **recent_parts)  # fmt: skip


def _run_tab(controls: dict[str, Any], *, key_required: bool) -> dict[str, Any]:
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            controls.update(
                prompt_boxes(
                    "",
                    prompt_lines=6,
                    system_lines=2,
                    mode_info="Prompt: the model continues your text. Chat: it answers your "
                    "message as an assistant, following the system prompt.",
                )
            )
            with gr.Row():
                earlier_note_box = earlier_note([])
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
            controls[adapters.ADAPTER] = adapters.picker()
            adapter_note = gr.Markdown(visible=False, elem_id="adapter_note")
            for parameter in MAIN_NUMBERS:
                controls[parameter.name] = number_control(parameter)
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
            controls[JSON_OUTPUT] = gr.Checkbox(
                False, label=LABELS[JSON_OUTPUT], info=JSON_HINT, elem_id="json_output"
            )
            with gr.Accordion("More settings", open=False):
                for parameter in MORE_NUMBERS:
                    controls[parameter.name] = number_control(parameter)

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

    return dict(
        adapter_note=adapter_note,
        earlier_note=earlier_note_box,
        new_chat=new_chat,
        run_button=run_button,
        stop_button=stop_button,
        answer=answer,
        result=result,
        prediction_id=prediction_id,
        curl_code=curl_code,
        python_code=python_code,
        openai_code=openai_code,
    )
