"""The adapter pickers' events: fill them from the api's `GET /v1/adapters` when the page opens
(only then: nothing polls, so an idle page costs nothing; reloading the page asks again), and
Compare's "Base vs adapter", which fills setting A with the base model and B with a fine-tune."""

from __future__ import annotations

from typing import Any

import gradio as gr

from tritonbox_playground.adapters import ADAPTER, choices, note_text, pick
from tritonbox_playground.api_client import AdapterInfo, ApiClient, PlaygroundError
from tritonbox_playground.compare import COLUMN_FIELDS, base_vs_adapter
from tritonbox_playground.layout import Layout

# For an empty prompt: one that shows what a fine-tune changes in a few words.
STARTING_PROMPT = "Tell me about the sea."


def wire_adapters(demo: gr.Blocks, page: Layout, api: ApiClient) -> None:
    """Register the events; call inside `gr.Blocks()`, after build_layout."""
    compare = page.compare
    pickers = [page.controls[ADAPTER], *(column[ADAPTER] for column in compare.columns)]
    pickers.append(page.batch.controls[ADAPTER])
    names = gr.State([])  # the adapters the api listed when this page opened

    async def show() -> list[Any]:
        problem = ""
        listed: list[AdapterInfo] | None = []
        try:
            listed = await api.adapters()
        except PlaygroundError as failure:
            problem = f"The adapters could not be listed: {failure.message}"
        note = gr.Markdown(problem or note_text(listed), visible=not listed)
        if listed:
            shown: Any = gr.Dropdown(choices=choices(listed), visible=True)
        else:  # keep the visibility: a restored run's adapter shows its picker (restored())
            shown = gr.Dropdown(choices=choices([]))
        return [
            *(shown for _ in pickers),
            note,
            note,
            gr.Button(visible=bool(listed)),
            [adapter.name for adapter in listed or []],
        ]

    outputs = [*pickers, page.adapter_note, compare.adapter_note, compare.base_vs_adapter, names]
    demo.load(show, outputs=outputs, api_name="adapters")

    a, b = compare.columns[:2]
    filled = [compare.shared["prompt"], *(a[n] for n in COLUMN_FIELDS)]
    filled += [*(b[n] for n in COLUMN_FIELDS), compare.third]

    def fill(prompt: str, preferred: str, max_tokens: Any, listed: list[str]) -> list[Any]:
        adapter = pick(listed, preferred)
        if adapter is None:  # the button is hidden then; a stale page may still show it
            gr.Warning("This api lists no adapter: reload the page to ask it again.")
            return [gr.skip() for _ in filled]
        first, second = base_vs_adapter(adapter, max_tokens)
        kept = prompt if (prompt or "").strip() else STARTING_PROMPT
        return [
            kept,
            *(first[n] for n in COLUMN_FIELDS),
            *(second[n] for n in COLUMN_FIELDS),
            False,
        ]

    compare.base_vs_adapter.click(
        fill,
        inputs=[compare.shared["prompt"], page.controls[ADAPTER], a["max_tokens"], names],
        outputs=filled,
        api_visibility="private",
        show_progress="hidden",
    )
