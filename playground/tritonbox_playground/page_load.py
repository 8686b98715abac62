"""What the page asks the api when it opens: this engine's limits (so every hint shows its
numbers), its adapters (adapter_events.py) and, for `/?compare=<id>,<id>`, the predictions of
a shared comparison."""

from __future__ import annotations

from typing import Any

import gradio as gr

from tritonbox_common import parameters as p
from tritonbox_playground import display
from tritonbox_playground.adapter_events import wire_adapters
from tritonbox_playground.api_client import ApiClient, EngineLimits, PlaygroundError
from tritonbox_playground.compare import QUERY
from tritonbox_playground.compare_app import (
    ABSOLUTE_LINK_JS,
    compare_outputs,
    comparison_values,
    open_comparison,
)
from tritonbox_playground.form import hint, prompt_hint
from tritonbox_playground.layout import Layout


def wire_page_load(demo: gr.Blocks, page: Layout, api: ApiClient) -> None:
    """Register the load events; call inside `gr.Blocks()`, after build_layout."""
    compare = page.compare
    limited = [page.controls["prompt"], page.controls[p.MAX_TOKENS.name]]
    limited += [page.controls[p.MIN_TOKENS.name], compare.shared["prompt"]]
    limited += [column[p.MAX_TOKENS.name] for column in compare.columns]
    limited += [page.batch.controls[p.MAX_TOKENS.name], page.batch.controls[p.MIN_TOKENS.name]]

    async def show_limits() -> list[Any]:
        """Every limit as this engine's number (the api knows it once Triton answers)."""
        try:
            limits: EngineLimits | None = await api.limits()
        except PlaygroundError:
            limits = None  # the hints say the number comes once the api answers
        prompt = gr.Textbox(info=prompt_hint(limits))
        tokens = gr.Number(info=hint(p.MAX_TOKENS, limits=limits))
        least = gr.Number(info=hint(p.MIN_TOKENS, limits=limits))
        return [prompt, tokens, least, prompt, *(tokens for _ in compare.columns), tokens, least]

    demo.load(show_limits, outputs=limited, api_name="limits")

    comparison = [page.tabs, *compare.inputs, *compare_outputs(compare)]

    async def open_from_url(request: gr.Request) -> Any:
        # `/?compare=<id>,<id>`: a shared comparison, reopened from the api's log.
        query = request.query_params.get(QUERY) if request is not None else None
        if not query:
            return [gr.skip() for _ in comparison]
        try:
            predictions, problem = await open_comparison(api, query)
        except PlaygroundError as failure:
            predictions, problem = [], failure.message
        values: dict[Any, Any] = {page.tabs: gr.Tabs(selected="compare")}
        if predictions:
            values.update(comparison_values(compare, predictions))
        if problem:
            values[compare.share] = display.error(
                f"Some of this comparison could not be opened: {problem}"
            )
        return values

    demo.load(open_from_url, outputs=comparison, api_visibility="private").then(
        None, inputs=compare.link, outputs=compare.link, js=ABSOLUTE_LINK_JS
    )
    wire_adapters(demo, page, api)
