"""How the OpenAI routes spell their objects: whole answers, stream chunks, usage, errors."""

from __future__ import annotations

import json
import time
from typing import Any

from tritonbox_api.db.models import FinishReason, Prediction, Status
from tritonbox_api.protocol.openai import Usage
from tritonbox_api.routes.sse import frame_parts
from tritonbox_api.service.runner import Started


def _reason(reason: FinishReason | str | None) -> str | None:
    if reason == FinishReason.LENGTH:
        return "length"
    if reason in (FinishReason.STOP, FinishReason.STOP_WORD):
        return "stop"
    return None


def finish_reason(prediction: Prediction) -> str | None:
    return _reason(prediction.finish_reason)


def choices(prediction: Prediction) -> list[tuple[int, str, str | None]]:
    """Each choice's index, output and OpenAI finish reason (one unless `n` > 1)."""
    if not prediction.choices:
        return [(0, prediction.output, finish_reason(prediction))]
    return [(c["index"], c["output"], _reason(c["finish_reason"])) for c in prediction.choices]


def usage(prediction: Prediction) -> dict[str, int]:
    prompt, completion = prediction.prompt_tokens or 0, prediction.completion_tokens or 0
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    ).model_dump()


def error_body(prediction: Prediction) -> str:
    kind = "canceled" if prediction.status is Status.CANCELED else "server_error"
    message = prediction.error or f"the prediction was {prediction.status.value}"
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


_SLOT = "\u0000text\u0000"  # stands for a delta's text in its encoded template


class Shape:
    """How one route spells its objects: `text_completion` or `chat.completion`."""

    def __init__(self, chat: bool, started: Started) -> None:
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{started.id}"
        self.model = started.model
        self.created = int(time.time())
        # A delta chunk is the same JSON around its text every time: encoded once, then only
        # the text is encoded per chunk (a dict and a whole json.dumps per token add up).
        self._deltas = {first: self._template(first) for first in (True, False)}
        self._events = {first: frame_parts(*self._deltas[first]) for first in (True, False)}

    def envelope(self, choice: dict[str, Any], chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        kind += ".chunk" if chunk and self.chat else ""
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def delta(
        self, text: str, *, first: bool, logprobs: dict[str, Any] | None = None, index: int = 0
    ) -> dict[str, Any]:
        """A chunk with `text` of choice `index`; `logprobs`: its tokens' (when asked for)."""
        extra = {} if logprobs is None else {"logprobs": logprobs}
        if not self.chat:
            choice = {"index": index, "text": text, **extra, "finish_reason": None}
            return self.envelope(choice, True)
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        choice = {"index": index, "delta": delta, **extra, "finish_reason": None}
        return self.envelope(choice, True)

    def delta_json(self, text: str, *, first: bool) -> str:
        """`json.dumps(self.delta(text, first=first), ensure_ascii=False)`, cheaper."""
        before, after = self._deltas[first]
        return before + json.dumps(text, ensure_ascii=False) + after

    def delta_event(self, text: str, *, first: bool) -> bytes:
        """`frame(self.delta_json(text, first=first))`: the chunk's SSE event, as sent."""
        before, after = self._events[first]
        # JSON has no raw line breaks: the event is one `data:` line.
        return before + json.dumps(text, ensure_ascii=False).encode() + after

    def _template(self, first: bool) -> tuple[str, str]:
        encoded = json.dumps(self.delta(_SLOT, first=first), ensure_ascii=False)
        # The text is the last string of the chunk: nothing after it can hold the slot's marker.
        before, _, after = encoded.rpartition(json.dumps(_SLOT))
        return before, after

    def last(self, prediction: Prediction) -> list[dict[str, Any]]:
        """The closing chunk of each choice, with its finish reason."""
        closing = []
        for index, _, reason in choices(prediction):
            if self.chat:
                choice = {"index": index, "delta": {}, "finish_reason": reason}
            else:
                choice = {"index": index, "text": "", "finish_reason": reason}
            closing.append(self.envelope(choice, True))
        return closing

    def whole(
        self, prediction: Prediction, logprobs: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The whole answer; `logprobs`: each choice's (by index), when asked for."""
        every = []
        for index, output, reason in choices(prediction):
            if self.chat:
                message = {"role": "assistant", "content": output}
                choice = {"index": index, "message": message}
            else:
                choice = {"index": index, "text": output}
            shown = logprobs[index] if logprobs is not None else None
            every.append({**choice, "logprobs": shown, "finish_reason": reason})
        return {**self.envelope(every[0], False), "choices": every, "usage": usage(prediction)}
