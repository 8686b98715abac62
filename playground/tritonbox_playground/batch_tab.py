"""The Batch tab's components: a file to upload (CSV or JSONL), the settings every row gets (built
as the Run tab builds its own, so hints and limits are the api's), progress, cancel, results and
their downloads. batch_app.py wires them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from tritonbox_common import parameters as p
from tritonbox_playground import adapters
from tritonbox_playground.batch_csv import COLUMNS
from tritonbox_playground.batch_results import HEADERS
from tritonbox_playground.form import FIELDS, LABELS, MAIN_NUMBERS, MORE_NUMBERS, WORD_LISTS, hint
from tritonbox_playground.json_output import JSON_HINT, JSON_OUTPUT
from tritonbox_playground.layout_parts import number_control

SUFFIX = "_batch"  # each control's elem_id is its Run tab twin's + this
# The form fields a batch takes (a batch is chat: no mode, and each row brings its prompt).
BATCH_FIELDS = tuple(name for name in FIELDS if name not in ("mode", "prompt"))


@dataclass
class BatchLayout:
    """Any: gradio adds the event methods (.click, .upload) at run time."""

    controls: dict[str, Any]
    upload: Any
    copy_settings: Any
    start: Any
    cancel: Any
    batch_id: Any
    follow: Any
    status: Any
    progress: Any
    results: Any
    csv_download: Any
    jsonl_download: Any
    errors_download: Any

    @property
    def form(self) -> list[Any]:
        """The settings in BATCH_FIELDS order: the events' inputs."""
        return [self.controls[name] for name in BATCH_FIELDS]


def _settings() -> dict[str, Any]:
    controls: dict[str, Any] = {adapters.ADAPTER: adapters.picker(SUFFIX)}
    controls["system_prompt"] = gr.Textbox(
        "",
        label="System prompt (optional)",
        info="For every row without a “system” cell of its own.",
        lines=2,
        elem_id=f"system_prompt{SUFFIX}",
    )
    for parameter in MAIN_NUMBERS:
        controls[parameter.name] = number_control(parameter, SUFFIX)
    with gr.Accordion("More settings", open=False):
        controls[p.SEED.name] = gr.Textbox(
            "", label=LABELS[p.SEED.name], info=hint(p.SEED), placeholder="random",
            elem_id=f"{p.SEED.name}{SUFFIX}",
        )  # fmt: skip
        for parameter in WORD_LISTS:
            controls[parameter.name] = gr.Textbox(
                "",
                label=LABELS[parameter.name],
                info=hint(parameter, " One per line; write \\n for a line break."),
                lines=2,
                elem_id=f"{parameter.name}{SUFFIX}",
            )
        for parameter in MORE_NUMBERS:
            controls[parameter.name] = number_control(parameter, SUFFIX)
        controls[JSON_OUTPUT] = gr.Checkbox(
            False, label=LABELS[JSON_OUTPUT], info=JSON_HINT, elem_id=f"json_output{SUFFIX}"
        )
    return controls


def build_batch() -> BatchLayout:
    """Create the tab's components; call inside `gr.Tab(...)`."""
    gr.Markdown(
        "Run **a whole file of prompts** and come back for the answers. Upload a **CSV** whose "
        "first line names the columns: `prompt`, and optionally any of "
        f"{', '.join(f'`{c}`' for c in COLUMNS[1:])} (a cell replaces the setting below for "
        "its row; `stop` holds one word per line). Or upload OpenAI batch lines (**JSONL**), "
        "sent as they are. Every row becomes a saved prediction with its permalink."
    )
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            upload = gr.File(
                label="CSV or JSONL file",
                file_types=[".csv", ".jsonl", ".txt"],
                type="filepath",
                elem_id="batch_file",
            )
            with gr.Row():
                start = gr.Button("Start batch", variant="primary", elem_id="batch_start")
                cancel = gr.Button("Cancel batch", variant="stop", elem_id="batch_cancel")
            status = gr.Markdown(elem_id="batch_status")
            progress = gr.HTML(elem_id="batch_progress")
            with gr.Row():
                batch_id = gr.Textbox(
                    label="Batch id",
                    placeholder="appears once the batch is created",
                    info="Paste a batch's id and press Follow to watch it again later.",
                    scale=4,
                    elem_id="batch_id",
                )
                follow = gr.Button("Follow", size="sm", scale=1, elem_id="batch_follow")
        with gr.Column(scale=2):
            copy_settings = gr.Button(
                "Use the settings of “Try a prompt”", size="sm", elem_id="batch_copy_settings"
            )
            controls = _settings()
    with gr.Row():
        csv_download = gr.DownloadButton(
            "Download CSV", visible=False, elem_id="batch_csv", size="sm"
        )
        jsonl_download = gr.DownloadButton(
            "Download JSONL (output file)", visible=False, elem_id="batch_jsonl", size="sm"
        )
        errors_download = gr.DownloadButton(
            "Download JSONL (error file)", visible=False, elem_id="batch_errors", size="sm"
        )
    results = gr.Dataframe(
        headers=HEADERS,
        datatype=["str", "str", "str", "str", "markdown", "str"],
        interactive=False,
        wrap=True,
        elem_id="batch_results",
        label="Results (each permalink opens that row's prediction)",
    )
    return BatchLayout(
        controls=controls, upload=upload, copy_settings=copy_settings, start=start,
        cancel=cancel, batch_id=batch_id, follow=follow, status=status, progress=progress,
        results=results, csv_download=csv_download, jsonl_download=jsonl_download,
        errors_download=errors_download,
    )  # fmt: skip
