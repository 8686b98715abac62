"""Live traffic first: how many engine requests batch lines may run now, and which running
lines stop to make room when a live request comes (the batch runner asks; docs/batches.md).

With no live request, lines take a worker's share of BATCH_CONCURRENT_REQUESTS, less what live
requests hold. While live requests run, and for LIVE_QUIET_S after the last one, lines keep at
most BATCH_REQUESTS_BESIDE_LIVE: on the cpu engine every request in the batch lengthens the
decode step a live request's first token waits for, and a full batch makes it wait in the
engine's queue until a line ends (docs/benchmark-batch.md has both measured).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

# After the last live request ends, lines stay held back this long: a client's next request (a
# closed loop's, a chat's follow-up) would otherwise find the engine's batch refilled with lines.
LIVE_QUIET_S = 2.0


class Line(Protocol):
    @property
    def slots(self) -> int: ...  # its engine requests

    @property
    def started(self) -> float: ...  # time.monotonic() when it started


L = TypeVar("L", bound=Line)


def limit(
    capacity: int, beside_live: int, live_slots: int, live_ended_at: float, now: float
) -> int:
    """Engine requests lines may run now (`live_ended_at`, `now`: time.monotonic())."""
    free = max(capacity - live_slots, 0)
    if live_slots or now - live_ended_at < LIVE_QUIET_S:
        return min(free, beside_live)
    return free


def to_stop(lines: Sequence[L], allowed: int) -> list[L]:
    """The lines to stop so that the rest take at most `allowed` engine requests: the newest
    first, the least work lost (they run again from the start)."""
    excess = sum(line.slots for line in lines) - allowed
    chosen = []
    for line in sorted(lines, key=lambda line: line.started, reverse=True):
        if excess <= 0:
            break
        chosen.append(line)
        excess -= line.slots
    return chosen
