"""The OpenAI routes' stream: `data:` chunks as the SDK expects them, each choice's log-probs
with its text, an error chunk mid-stream when the prediction fails, then `data: [DONE]`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from tritonbox_api.db.models import Status
from tritonbox_api.routes.openai_logprobs import LogprobShape
from tritonbox_api.routes.openai_shape import Shape, error_body, usage
from tritonbox_api.routes.sse import frame
from tritonbox_api.service.predictions import Ended
from tritonbox_api.service.runner import Started
from tritonbox_api.service.running import ChoiceText


async def sse(
    shape: Shape, started: Started, include_usage: bool, logprobs: list[LogprobShape] | None
) -> AsyncIterator[bytes]:
    first = True
    given = [0] * len(started.running.logprobs)  # each choice's entries sent so far
    started_choices: set[int] = set()  # the other choices that sent a chunk (`n` > 1)

    def entries_of(index: int) -> dict[str, Any] | None:
        """Choice `index`'s log-probs not sent yet (its tokens came before their text)."""
        if logprobs is None:
            return None
        entries = started.running.logprobs[index][given[index] :]
        given[index] += len(entries)
        return logprobs[index].part(entries)

    async for event in started.events():
        if isinstance(event, ChoiceText):
            new = event.index not in started_choices
            started_choices.add(event.index)
            chunk = shape.delta(
                event.text, first=new, index=event.index, logprobs=entries_of(event.index)
            )
            yield frame(json.dumps(chunk, ensure_ascii=False))
            continue
        if not isinstance(event, Ended):
            if logprobs is None:
                yield shape.delta_event(event, first=first)
            else:
                chunk = shape.delta(event, first=first, logprobs=entries_of(0))
                yield frame(json.dumps(chunk, ensure_ascii=False))
            first = False
            continue
        prediction = event.prediction
        if prediction.status is Status.SUCCEEDED:
            for index, entries in enumerate(started.running.logprobs):
                if logprobs is None or given[index] == len(entries):
                    continue
                # Tokens whose text never came: a stop word's, the end token.
                new = first if index == 0 else index not in started_choices
                part = entries_of(index)
                chunk = shape.delta("", first=new, index=index, logprobs=part)
                yield frame(json.dumps(chunk, ensure_ascii=False))
            for closing in shape.last(prediction):
                yield frame(json.dumps(closing))
            if include_usage:
                yield frame(json.dumps({**shape.envelope({}, True), "choices": [],
                                        "usage": usage(prediction)}))  # fmt: skip
        else:
            yield frame(error_body(prediction))
    yield frame("[DONE]")
