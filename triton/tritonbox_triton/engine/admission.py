"""How long an idle engine waits before a prefill, so that requests arriving as a burst share one
prefill pass.

Requests reach the engine one at a time, even when clients send them together: each passes the
api and the preprocessing model first, and a burst of 16 sent straight to Triton arrives over
10–35 ms, the first one ~7 ms ahead of the rest (through the api, which admits them in turn on
its event loop, more spread out). An idle engine that prefills whatever has arrived prefills the
first request alone and the rest together: two passes of the weights instead of one, and the
rest wait for both. So while requests have lately come in bursts (two within `WINDOW_S` of each
other in the last `MEMORY_S`), an idle engine lets the rest of a burst join the first one's
prefill: it waits until no request has arrived for `QUIET_S`, or until `WINDOW_S` after the
first one arrived, whichever comes first, so a wave that has all arrived starts a few
milliseconds after its last request. A request that waited and found no company ends the
waiting: requests that come one at a time do not wait (after the first of them, once), so a
single stream's time to first token is unchanged.

A wave that ends together announces the next one: clients that wait for their answers (a chat
front end, a load generator, any closed loop) send their next requests as their streams end,
and through the api those arrive over ~25 ms, the first a few ms ahead of the others, so an
8 ms quiet gap split such a wave into a lone prefill and one for the rest (the rest then waited
for both). So when the batch empties with several requests ending in one step, the engine
expects as many back: when the first of them arrives within `WAVE_RETURN_S` of that step, it
waits for the rest with the longer `WAVE_QUIET_S` gap, up to `WAVE_WINDOW_S` after the first,
and starts the moment the last of them has arrived rather than after a quiet gap. Through the
api a wave of 16 reached the engine 50–75 ms after its predecessor ended, sometimes its first
request ~33 ms ahead of the rest (the first prediction row is written alone, the others then
together behind it: db/group_commit.py), which the 20 ms gap and 40 ms window of the seventh
round split into a lone prefill and one for the 15 others.

A large wave or burst is not held back for its last request: it is prefilled in two passes.
A pass costs a fixed ~22 ms and ~10.5 ms a 39-token prompt (the AMX machine, bfloat16), so one
pass of 16 kept the first arrivals waiting for the last (through the api a wave reaches the
engine over ~35 ms) and for the other prompts' share of the pass. From `SPLIT_FROM` requests on
(the wave's expected count; for a burst, whose size is unknown, the engine's batch) the wait
ends once half of them are in; the rest arrive during that pass and take the next one. The
second half waits about one pass's fixed cost longer than it would have, the first half gets
its first token in about half the time (docs/cpu-engine.md, ninth round).

Triton's own dynamic batcher has the same knob (`max_queue_delay_microseconds`), fixed.
"""

from __future__ import annotations

import math

WINDOW_S = 0.04
QUIET_S = 0.008
WAVE_RETURN_S = 0.1
WAVE_QUIET_S = 0.04
WAVE_WINDOW_S = 0.08
MEMORY_S = 30.0
SPLIT_FROM = 8


def enough_to_start(expected: int) -> int:
    """How many of `expected` requests, once waiting, end an idle engine's wait: all of a small
    group, half of one of `SPLIT_FROM` or more."""
    return expected if expected < SPLIT_FROM else math.ceil(expected / 2)


class BurstWindow:
    """Tells an idle engine until when to wait for the rest of a burst."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        memory_s: float = MEMORY_S,
        quiet_s: float = QUIET_S,
        wave_quiet_s: float = WAVE_QUIET_S,
        wave_window_s: float = WAVE_WINDOW_S,
        wave_return_s: float = WAVE_RETURN_S,
    ) -> None:
        self._window_s = window_s
        self._quiet_s = quiet_s
        self._wave_quiet_s = wave_quiet_s
        self._wave_window_s = wave_window_s
        self._wave_return_s = wave_return_s
        self._memory_s = memory_s
        self._last_arrival = -math.inf
        self._burst_seen = -math.inf
        self._wave_ended = -math.inf  # when the batch last emptied with several ending at once
        self._expected = 0  # how many requests that wave's clients are expected to send back
        self._ending = 0  # requests ended in steps less than `window_s` apart, up to the last
        self._last_end = -math.inf

    def arrived(self, now: float) -> None:
        """A request arrived at `now` (time.monotonic())."""
        if now - self._last_arrival < self._window_s:
            self._burst_seen = now
        self._last_arrival = now

    def ended(self, count: int, now: float, *, idle: bool) -> None:
        """`count` requests ended in a step at `now`; `idle`: no request runs after it."""
        if now - self._last_end >= self._window_s:
            self._ending = 0
        self._ending += count
        self._last_end = now
        if idle and self._ending >= 2:
            self._wave_ended, self._expected = now, self._ending

    def wait_until(
        self, first_arrival: float, now: float, waiting: int = 1, batch: int = 0
    ) -> float | None:
        """When an idle engine with `waiting` requests, the oldest arrived at `first_arrival`,
        should prefill: None for at once (no burst lately, or enough of the expected wave or of
        a burst as large as the engine's `batch` is in), else a time.monotonic() deadline."""
        # The next wave is coming. Its first request may even come in before the step that
        # ended the last one has finished: its client had its answer from that step.
        since_wave = first_arrival - self._wave_ended
        if -self._window_s < since_wave < self._wave_return_s:
            if waiting >= enough_to_start(self._expected):
                return None
            return min(first_arrival + self._wave_window_s, self._last_arrival + self._wave_quiet_s)
        if now - self._burst_seen > self._memory_s or (batch and waiting >= enough_to_start(batch)):
            return None
        return min(first_arrival + self._window_s, self._last_arrival + self._quiet_s)

    def alone(self) -> None:
        """A request waited for the rest of a burst and none came: requests come one at a time
        now, and the next ones do not wait."""
        self._burst_seen = self._wave_ended = -math.inf
