"""Controls that the Run and Compare tabs build alike, and the names their events show."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import gradio as gr

from tritonbox_common import parameters as p
from tritonbox_playground.form import INTEGERS, LABELS, hint


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
