"""Which prediction each browser session is running, so that Stop can cancel it on the api.

Stop is its own event: it finds the run by the session, asks the api to cancel the prediction
(known from the X-Prediction-Id header), and the run's stream then ends with the canceled
prediction, permalink included. A Stop that comes before the api has answered with the id is
remembered, and the run cancels itself as soon as the id arrives. A comparison is one run of
several predictions: Stop cancels them all.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tritonbox_playground.api_client import PlaygroundError


@dataclass
class RunHandle:
    """One Run (one prediction) or one Compare (one per setting)."""

    prediction_ids: list[str] = field(default_factory=list)
    stop_requested: bool = False


class ActiveRuns:
    def __init__(self, capacity: int = 10_000) -> None:
        self._runs: OrderedDict[str, RunHandle] = OrderedDict()
        self._capacity = capacity  # sessions whose run was torn down mid-way never end theirs

    def begin(self, session: str) -> RunHandle:
        handle = RunHandle()
        self._runs[session] = handle
        self._runs.move_to_end(session)
        while len(self._runs) > self._capacity:
            self._runs.popitem(last=False)
        return handle

    def end(self, session: str, handle: RunHandle) -> None:
        if self._runs.get(session) is handle:
            del self._runs[session]

    def get(self, session: str) -> RunHandle | None:
        return self._runs.get(session)


def session_of(request: Any) -> str:
    """The browser session a run belongs to (a gr.Request): gradio_client and browsers both
    have a session hash; a missing one shares a slot."""
    session = getattr(request, "session_hash", None) if request is not None else None
    return str(session or "anonymous")


async def stop_run(
    handle: RunHandle | None, cancel: Callable[[str], Awaitable[object]]
) -> list[str] | None:
    """Ask the api to cancel every prediction of the run: None when nothing runs, else what went
    wrong, in the api's words. With no id yet the run cancels itself when the api names it."""
    if handle is None:
        return None
    handle.stop_requested = True
    problems: list[str] = []
    for prediction_id in handle.prediction_ids:
        try:
            await cancel(prediction_id)
        except PlaygroundError as failure:
            problems.append(failure.message)
    return problems
