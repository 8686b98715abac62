"""The Compare tab's components: one prompt, a column of settings per setting (A, B, optional C),
their answers side by side, and the link that reopens the comparison. compare_app.py wires them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from tritonbox_common import parameters as p
from tritonbox_playground import adapters
from tritonbox_playground.compare import COLUMN_FIELDS, COLUMNS, SHARED, column_defaults
from tritonbox_playground.form import CHAT_MODE, LABELS, PROMPT_MODE, hint
from tritonbox_playground.layout_parts import number_control, prompt_boxes

# One click fills the tab with a comparison worth running: (button, mode, system prompt,
# prompt, max tokens, then (temperature, stop words, bad words) for A and for B).
PRESETS = [
    ("Temperature 0 vs 1", PROMPT_MODE, "", "Write one sentence about the moon:", 30,
     (0.0, "", ""), (1.0, "", "")),
    ("Without and with a stop word", PROMPT_MODE, "", "List the days of the week: Monday,", 40,
     (0.0, "", ""), (0.0, "Friday", "")),
    ("Without and with bad words", PROMPT_MODE, "", "Three fruits that are red:", 24,
     (0.0, "", ""), (0.0, "", "cherry\ncherries")),
    ("Chat: without and with a stop word", CHAT_MODE, "Answer in one short sentence.",
     "What is the capital of France?", 24, (0.0, "", ""), (0.0, ".", "")),
]  # fmt: skip


@dataclass
class CompareLayout:
    """Any: gradio adds the event methods (.click, .change) at run time."""

    shared: dict[str, Any]
    columns: list[dict[str, Any]]
    third: Any
    run_button: Any
    stop_button: Any
    answers: list[Any] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)
    settings_boxes: list[Any] = field(default_factory=list)
    answer_boxes: list[Any] = field(default_factory=list)
    presets: list[Any] = field(default_factory=list)
    base_vs_adapter: Any = None  # the preset that compares the base model with a fine-tune
    adapter_note: Any = None
    share: Any = None
    link: Any = None

    @property
    def inputs(self) -> list[Any]:
        """Shared fields, then each column's COLUMN_FIELDS in order, then the third switch."""
        per_column = [column[name] for column in self.columns for name in COLUMN_FIELDS]
        return [*(self.shared[name] for name in SHARED), *per_column, self.third]


def _column(label: str, index: int) -> dict[str, Any]:
    start = column_defaults(index)
    suffix = f"_{label.lower()}"
    gr.Markdown(f"### Setting {label}")
    controls: dict[str, Any] = {adapters.ADAPTER: adapters.picker(suffix)}
    for parameter in (p.TEMPERATURE, p.MAX_TOKENS):
        controls[parameter.name] = number_control(parameter, suffix, start[parameter.name])
    for parameter in (p.STOP_WORDS, p.BAD_WORDS):
        controls[parameter.name] = gr.Textbox(
            "",
            label=LABELS[parameter.name],
            info=hint(parameter, " One per line."),
            lines=2,
            elem_id=f"{parameter.name}{suffix}",
        )
    with gr.Accordion("More", open=False):
        for parameter in (p.TOP_P, p.TOP_K):
            controls[parameter.name] = number_control(parameter, suffix)
        controls[p.SEED.name] = gr.Textbox(
            "",
            label=LABELS[p.SEED.name],
            info="Empty: every setting gets the same random seed, so only your changes differ.",
            elem_id=f"seed{suffix}",
        )
    return controls


def build_compare() -> CompareLayout:
    """Create the tab's components; call inside `gr.Tab(...)`."""
    gr.Markdown(
        "Run **one prompt with two or three settings side by side** and see how the answers "
        "differ, or the base model next to a fine-tune of it (an adapter). Each answer is "
        "saved with its own permalink, and one link reopens the whole comparison. Start from "
        "an example or write your own prompt, change a setting, then press **Compare**."
    )
    with gr.Row():
        # Shown once the api lists an adapter: fills A with the base model, B with a fine-tune.
        base_vs_adapter = gr.Button(
            "Base vs adapter", size="sm", visible=False, elem_id="compare_base_vs_adapter"
        )
        presets = [gr.Button(preset[0], size="sm") for preset in PRESETS]
    adapter_note = gr.Markdown(visible=False, elem_id="compare_adapter_note")
    shared: dict[str, Any] = prompt_boxes("compare_", prompt_lines=3, system_lines=1)
    third = gr.Checkbox(False, label="Add a third setting (C)", elem_id="compare_third")
    columns, settings_boxes = [], []
    with gr.Row(equal_height=False):
        for index, label in enumerate(COLUMNS):
            with gr.Column(min_width=260, visible=index < 2) as box:
                columns.append(_column(label, index))
            settings_boxes.append(box)
    with gr.Row():
        run_button = gr.Button("Compare", variant="primary", elem_id="compare_run")
        stop_button = gr.Button("Stop", variant="stop", elem_id="compare_stop")
    layout = CompareLayout(
        shared=shared,
        columns=columns,
        third=third,
        run_button=run_button,
        stop_button=stop_button,
        presets=presets,
        base_vs_adapter=base_vs_adapter,
        adapter_note=adapter_note,
        settings_boxes=settings_boxes,
    )
    with gr.Row(equal_height=False):
        for index, label in enumerate(COLUMNS):
            with gr.Column(min_width=260, visible=index < 2) as box:
                layout.answers.append(
                    gr.Textbox(
                        label=f"Answer {label}",
                        lines=6,
                        interactive=False,
                        buttons=["copy"],
                        elem_id=f"compare_answer_{label.lower()}",
                    )
                )
                layout.results.append(gr.Markdown(elem_id=f"compare_result_{label.lower()}"))
            layout.answer_boxes.append(box)
    layout.share = gr.Markdown(elem_id="compare_share")
    layout.link = gr.Textbox(
        label="Link to this comparison",
        interactive=False,
        buttons=["copy"],
        placeholder="appears once the comparison has run",
        elem_id="compare_link",
    )
    return layout
