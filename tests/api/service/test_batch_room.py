"""Live traffic first (service/batch_room.py): how many engine requests batch lines may run, and
which running lines stop when a live request comes."""

from __future__ import annotations

from dataclasses import dataclass

from tritonbox_api.service.batch_room import LIVE_QUIET_S, limit, to_stop


@dataclass
class Running:
    name: str
    slots: int
    started: float


def test_lines_take_the_share_live_requests_leave_when_none_ran_lately() -> None:
    quiet = 100.0 - LIVE_QUIET_S - 0.01
    assert limit(16, 2, live_slots=0, live_ended_at=quiet, now=100.0) == 16
    assert limit(16, 2, live_slots=0, live_ended_at=float("-inf"), now=100.0) == 16


def test_while_live_requests_run_or_ran_lately_lines_keep_at_most_their_bound() -> None:
    assert limit(16, 2, live_slots=1, live_ended_at=float("-inf"), now=100.0) == 2
    assert limit(16, 0, live_slots=4, live_ended_at=float("-inf"), now=100.0) == 0
    # Between a closed loop's requests: none runs, the last ended a moment ago.
    assert limit(16, 2, live_slots=0, live_ended_at=100.0 - 0.05, now=100.0) == 2
    # Live requests filling the share leave lines nothing, whatever their bound.
    assert limit(4, 8, live_slots=3, live_ended_at=float("-inf"), now=100.0) == 1
    assert limit(4, 8, live_slots=6, live_ended_at=float("-inf"), now=100.0) == 0


def test_the_newest_lines_stop_first_until_the_rest_fit() -> None:
    lines = [Running("old", 1, 1.0), Running("n3", 3, 5.0), Running("mid", 1, 3.0)]
    assert [x.name for x in to_stop(lines, 1)] == ["n3", "mid"]
    assert [x.name for x in to_stop(lines, 2)] == ["n3"]  # 5 - 3 = 2: enough
    assert [x.name for x in to_stop(lines, 0)] == ["n3", "mid", "old"]
    assert to_stop(lines, 5) == [] and to_stop([], 0) == []
