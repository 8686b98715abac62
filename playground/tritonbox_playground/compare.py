"""Compare: one prompt, two or three settings, run side by side.

Each setting is a prediction of its own (its own permalink); the comparison itself is only the
list of their ids, `?compare=<id>,<id>`: reopening it asks the api for those predictions, so no
state is kept anywhere but in the api's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

from tritonbox_common import parameters as p
from tritonbox_playground import display
from tritonbox_playground.adapters import ADAPTER, BASE, adapter_name
from tritonbox_playground.api_client import ApiClient, PlaygroundError, PredictionView, StreamEvent
from tritonbox_playground.form import LABELS, defaults, from_prediction, text_from_words

COLUMNS = ("A", "B", "C")
SHARED = ("mode", "system_prompt", "prompt")
# What each column sets; the rest keep the api's defaults. The adapter is a setting like the
# others, so "base vs fine-tune" is one comparison with one share link.
COLUMN_FIELDS = (
    ADAPTER,
    p.TEMPERATURE.name,
    p.MAX_TOKENS.name,
    p.STOP_WORDS.name,
    p.BAD_WORDS.name,
    p.TOP_P.name,
    p.TOP_K.name,
    p.SEED.name,
)
# A first-time visitor sees a comparison worth running: the same prompt, cold and warm.
STARTING_TEMPERATURES = (0.0, 1.0, 1.5)
QUERY = "compare"


def column_defaults(index: int) -> dict[str, Any]:
    values = defaults()
    values[p.TEMPERATURE.name] = STARTING_TEMPERATURES[index]
    return {name: values[name] for name in COLUMN_FIELDS}


def base_vs_adapter(adapter: str, max_tokens: Any = None) -> list[dict[str, Any]]:
    """Settings A (the base model) and B (`adapter`), alike in everything else and greedy, so
    the two answers differ only by what the fine-tune learned."""
    side = column_defaults(0) | {p.TEMPERATURE.name: 0.0}
    if max_tokens:
        side[p.MAX_TOKENS.name] = max_tokens
    return [side | {ADAPTER: BASE}, side | {ADAPTER: adapter}]


def with_shared_seed(columns: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Columns without a seed get one random seed together, so two answers differ only by the
    settings that differ (not by luck); each prediction still records the seed it ran with."""
    seed = str(secrets.randbelow(2**31))
    return [
        {**column, p.SEED.name: column.get(p.SEED.name) or seed}
        if not str(column.get(p.SEED.name) or "").strip()
        else dict(column)
        for column in columns
    ]


def share_query(prediction_ids: Sequence[str]) -> str:
    return f"?{QUERY}=" + ",".join(prediction_ids)


def parse_ids(text: str | None) -> list[str]:
    """Prediction ids from `a,b,c` (permalinks accepted too), at most one per column."""
    ids = [part.strip().rstrip("/").rsplit("/", 1)[-1] for part in (text or "").split(",")]
    return [prediction_id for prediction_id in ids if prediction_id][: len(COLUMNS)]


def _shown(name: str, value: Any) -> str:
    if name == ADAPTER:
        return str(value or BASE)
    if name in (p.STOP_WORDS.name, p.BAD_WORDS.name):
        words = [str(word) for word in value] if isinstance(value, list) else []
        return ", ".join(f"“{text_from_words([word])}”" for word in words) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return "–" if value is None else str(value)


def _same(value: Any) -> str:
    return repr(None if value in (None, [], "") else value)


def differences(predictions: Sequence[PredictionView]) -> list[str]:
    """For each prediction, the settings in which it differs from the others, e.g.
    "Temperature 0 · Stop words “.”" (empty when all are alike)."""
    sent = [
        {**prediction.input, **prediction.applied, ADAPTER: adapter_name(prediction)}
        for prediction in predictions
    ]
    names = [
        name
        for name in LABELS
        if len({_same(values.get(name)) for values in sent}) > 1
        and name != p.SEED.name  # a seed differs by chance, not as a setting to compare
    ]
    return [
        " · ".join(f"{LABELS[name]} {_shown(name, values.get(name))}" for name in names)
        for values in sent
    ]


def column_result(label: str, prediction: PredictionView, differs: str) -> str:
    head = f"**Setting {label}**" + (f": {display.escape(differs)}" if differs else "")
    return f"{head}\n\n{display.outcome(prediction)}"


def restored(predictions: Sequence[PredictionView]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The shared prompt (from the first prediction) and each column's settings."""
    states = [from_prediction(prediction).values for prediction in predictions]
    shared = {name: states[0][name] for name in SHARED}
    return shared, [{name: state[name] for name in COLUMN_FIELDS} for state in states]


Event = tuple[int, StreamEvent | PlaygroundError]


async def stream_together(api: ApiClient, bodies: Sequence[dict[str, Any]]) -> AsyncIterator[Event]:
    """Every body's stream events as they come, tagged with the body's index; a failure ends
    only its own stream. Leaving early closes every stream (the api cancels those runs)."""
    queue: asyncio.Queue[Event | tuple[int, None]] = asyncio.Queue()

    async def pump(index: int, body: dict[str, Any]) -> None:
        try:
            async with contextlib.aclosing(api.stream_prediction(body)) as events:
                async for event in events:
                    await queue.put((index, event))
        except PlaygroundError as failure:
            await queue.put((index, failure))
        finally:
            await queue.put((index, None))

    tasks = [asyncio.create_task(pump(index, body)) for index, body in enumerate(bodies)]
    try:
        running = len(tasks)
        while running:
            index, event = await queue.get()
            if event is None:
                running -= 1
            else:
                yield index, event
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
