"""The adapter picker: which fine-tune (a LoRA adapter registered on the api) answers a run.

The Run tab has one picker, each Compare setting its own, so "base vs fine-tune" is a
comparison like any other. The choices are the api's `GET /v1/adapters`, asked when the page
opens (adapter_events.py), never on a timer: an idle page costs nothing. Until the api has
answered, or when it lists no adapter, the pickers stay hidden and a short note says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gradio as gr

from tritonbox_common import parameters as p
from tritonbox_common.snippets import SHORT_SHA
from tritonbox_playground.api_client import AdapterInfo, ApiClient, PlaygroundError, PredictionView

ADAPTER = p.ADAPTER.name
# The picker's "no adapter" choice. Adapter names cannot contain a space
# (^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$), so this never names an adapter.
BASE = "base model"


def is_base(value: Any) -> bool:
    text = str(value or "").strip()
    return not text or text == BASE


def sent(value: Any) -> str | None:
    """The api's `adapter` for a picker's value (None: the base model, nothing to send)."""
    return None if is_base(value) else str(value).strip()


def adapter_name(prediction: PredictionView) -> str | None:
    """The adapter that produced `prediction` (as the api recorded it), else the one asked for
    (a run that failed before it started, e.g. an adapter unknown to the api)."""
    if prediction.adapter is not None:
        return prediction.adapter.name
    asked = prediction.input.get(ADAPTER)
    return str(asked) if isinstance(asked, str) and asked else None


def pick(names: Sequence[str], preferred: Any) -> str | None:
    """The fine-tune to compare with the base: the one picked on the Run tab if the api has
    it, else the first the api lists (None: there is none)."""
    if not is_base(preferred) and str(preferred).strip() in names:
        return str(preferred).strip()
    return names[0] if names else None


def sha256_of(adapters: Sequence[AdapterInfo] | None, name: str | None) -> str | None:
    """The sha256 the api lists for adapter `name` (None: the base model, or not listed)."""
    return next((a.sha256 or None for a in adapters or [] if name and a.name == name), None)


async def listed_sha256(api: ApiClient, body: dict[str, Any]) -> str | None:
    """The sha256 the api lists now for the adapter `body` asks for: asked when the snippet is
    made, not when the page opened (the adapter may have been registered again since). None for
    the base, or when the api cannot say: the snippet still runs, only without the hash."""
    if not body.get(ADAPTER):
        return None
    try:
        return sha256_of(await api.adapters(), body[ADAPTER])
    except PlaygroundError:
        return None


def label(adapter: AdapterInfo) -> str:
    return f"{adapter.name} · {adapter.sha256[:SHORT_SHA]}" if adapter.sha256 else adapter.name


def choices(adapters: Sequence[AdapterInfo]) -> list[tuple[str, str]]:
    """(label, value) pairs: the base model first, then each adapter with its short hash."""
    return [(BASE, BASE), *((label(adapter), adapter.name) for adapter in adapters)]


def note_text(adapters: Sequence[AdapterInfo] | None) -> str:
    """What the page says about adapters ("" when there are some: the picker speaks)."""
    if adapters is None:
        return "Adapters are turned off on this api: every run uses the base model."
    if not adapters:
        return (
            "No adapters are registered on this api yet: every run uses the base model "
            "(an owner adds fine-tunes with `POST /v1/adapters`)."
        )
    return ""


def picker(suffix: str = "") -> Any:
    """A hidden picker (shown once the api lists adapters). Custom values are allowed so that a
    restored run keeps an adapter the api no longer has, and the api's 404 names it."""
    return gr.Dropdown(
        choices=[(BASE, BASE)],
        value=BASE,
        label="Adapter",
        info="A fine-tune of the model (LoRA) registered on the api, or the base model.",
        allow_custom_value=True,
        filterable=True,
        visible=False,
        elem_id=f"{ADAPTER}{suffix}",
    )


def restored(value: Any) -> Any:
    """A picker's restored value; an adapter shows the picker even if the api lists none now
    (so the person sees what will be sent, and can switch back to the base model)."""
    return value if is_base(value) else gr.Dropdown(value=value, visible=True)
