"""How long an idle engine waits before a prefill, so that requests arriving as a burst share one
prefill pass.

Requests reach the engine one at a time, even when clients send them together: each passes the
api and the preprocessing model first, and a burst of 16 sent straight to Triton arrives over
10–35 ms, the first one ~7 ms ahead of the rest (through the api, which admits them in turn on
its event loop, more spread out). An idle engine that prefills whatever has arrived prefills the
first request alone and the rest together: two passes of the weights instead of one, and the
rest wait for both. So while requests have lately come in bursts (two within `window_s` of each
other in the last `memory_s`), an idle engine lets the rest of a burst join the first one's
prefill: it waits until no request has arrived for `quiet_s`, or until `window_s` after the
first one arrived, whichever comes first, so a wave that has all arrived starts a few
milliseconds after its last request. A request that waited and found no company ends the
waiting: requests that come one at a time do not wait (after the first of them, once), so a
single stream's time to first token is unchanged.

A wave that ends together announces the next one: clients that wait for their answers (a chat
front end, a load generator, any closed loop) send their next requests as their streams end,
and through the api those arrive over ~25 ms, the first a few ms ahead of the others, so an
8 ms quiet gap split such a wave into a lone prefill and one for the rest (the rest then waited
for both). So when the batch empties with several requests ending in one step, the engine
expects as many back: when the first of them arrives within `wave_return_s` of that step, it
waits for the rest with the longer `wave_quiet_s` gap, up to `wave_window_s` after the first,
and starts the moment the last of them has arrived rather than after a quiet gap. It does so
only while waves have been seen to come back: two or more requests within the return window of
a wave's end (`wave_return_s` + `wave_window_s`) in the last `memory_s`. Open-loop traffic
(users who do not wait for each other) empties the batch with two ending together as often, and
no wave follows: a lone request then starts at once, where it waited `wave_quiet_s` before.
The first wave of a closed loop that comes back is not waited for (it shows that waves do), the
later ones are. Through the
api a wave of 16 reached the engine 50–75 ms after its predecessor ended, sometimes its first
request ~33 ms ahead of the rest (the first prediction row is written alone, the others then
together behind it: db/group_commit.py), which the 20 ms gap and 40 ms window of the seventh
round split into a lone prefill and one for the 15 others.

A large wave or burst is not held back for its last request, nor prefilled in one pass: it is
prefilled in two. A pass costs a fixed part and a part per prompt (the AMX machine: ~22 ms and
~10.5 ms a 39-token prompt; an AMD EPYC served: ~30 ms and ~9 ms), so one pass of 16 kept every
request waiting for all the others' share of it. Of a wave of N, a first pass of n and a second of
the rest give the wave its least mean time to first token at n = N/2 + fixed / (2 x per prompt):
N/2 + 1 to 1.7 on both machines, so the first pass takes one more than half (9 of 16, 5 of 8).
From `split_from` requests on (the wave's expected count; for a burst, whose size is unknown, the
engine's batch) the wait ends once that many are in, and a first pass takes no more even when
more are waiting; where fewer came before the wait ended, they are all there is, and the first
pass is one more than half of them. The rest take the next passes right after it, before the
decode step (split the same way where they are many: a wave that grew past the one expected).
Of 16 at once on the AMD machine: 9 first tokens after ~110 ms and 7 after ~200, against all 16
after ~175 in one pass (the mean ~150 against ~175; the last ~25 ms later, one pass's fixed
cost; docs/cpu-engine-history.md, tenth round). Below `split_from` the second pass's fixed cost
outweighs the gain: a group is waited for and prefilled whole.

Triton's own dynamic batcher has the same knob (`max_queue_delay_microseconds`), fixed. The
waits and `split_from` are `EngineTimings` fields (timings.py), with the case each is for.
"""

from __future__ import annotations

import math

from .timings import DEFAULT_TIMINGS, EngineTimings


def first_pass(expected: int, split_from: int = DEFAULT_TIMINGS.split_from) -> int:
    """How many of `expected` requests an idle engine prefills in its first pass (and waits
    for): all of a small group, one more than half of one of `split_from` or more."""
    return expected if expected < split_from else expected // 2 + 1


class BurstWindow:
    """Tells an idle engine until when to wait for the rest of a burst."""

    def __init__(self, timings: EngineTimings = DEFAULT_TIMINGS) -> None:
        self._window_s = timings.window_s
        self._quiet_s = timings.quiet_s
        self._wave_quiet_s = timings.wave_quiet_s
        self._wave_window_s = timings.wave_window_s
        self._wave_return_s = timings.wave_return_s
        self._memory_s = timings.memory_s
        self._split_from = timings.split_from
        self._last_arrival = -math.inf
        self._burst_seen = -math.inf
        self._wave_ended = -math.inf  # when the batch last emptied with several ending at once
        self._expected = 0  # how many requests that wave's clients are expected to send back
        self._ending = 0  # requests ended in steps less than `window_s` apart, up to the last
        self._last_end = -math.inf
        self._returned = 0  # requests arrived within that wave's return window so far
        self._returns_seen = -math.inf  # when a wave was last seen coming back (two returned)

    def arrived(self, now: float) -> None:
        """A request arrived at `now` (time.monotonic())."""
        if now - self._last_arrival < self._window_s:
            self._burst_seen = now
        self._last_arrival = now
        if -self._window_s < now - self._wave_ended < self._wave_return_s + self._wave_window_s:
            self._returned += 1
            if self._returned >= 2:
                self._returns_seen = now

    def ended(self, count: int, now: float, *, idle: bool) -> None:
        """`count` requests ended in a step at `now`; `idle`: no request runs after it."""
        if now - self._last_end >= self._window_s:
            self._ending = 0
        self._ending += count
        self._last_end = now
        if idle and self._ending >= 2:
            self._wave_ended, self._expected = now, self._ending
            # A client may have its answer, and be back, before the step that ended it is over.
            self._returned = int(now - self._last_arrival < self._window_s)
        if idle:  # the batch emptied: whatever ends next belongs to the next wave
            self._ending = 0

    def wait_until(
        self, first_arrival: float, now: float, waiting: int = 1, batch: int = 0
    ) -> float | None:
        """When an idle engine with `waiting` requests, the oldest arrived at `first_arrival`,
        should prefill: None for at once (no burst lately, or enough of the expected wave or of
        a burst as large as the engine's `batch` is in), else a time.monotonic() deadline."""
        if self._returning(first_arrival):
            if waiting >= first_pass(self._expected, self._split_from):
                return None
            return min(first_arrival + self._wave_window_s, self._last_arrival + self._wave_quiet_s)
        if now - self._burst_seen > self._memory_s or (
            batch and waiting >= first_pass(batch, self._split_from)
        ):
            return None
        return min(first_arrival + self._window_s, self._last_arrival + self._quiet_s)

    def first_pass_size(self, first_arrival: float, waiting: int, batch: int = 0) -> int:
        """How many of `waiting` requests an idle engine prefills first once its wait is over,
        the oldest arrived at `first_arrival`: `first_pass` of the returning wave's count (else
        of the engine's `batch`), or of those waiting where there are more; where fewer than
        that count's first pass came before the wait ended, they are all that came, and
        `first_pass` of them."""
        expected = self._expected if self._returning(first_arrival) else batch
        whole = (
            max(expected, waiting) if waiting >= first_pass(expected, self._split_from) else waiting
        )
        return min(waiting, first_pass(whole, self._split_from))

    def _returning(self, first_arrival: float) -> bool:
        """Whether a request that arrived at `first_arrival` opens the wave expected back. It may
        even come in before the step that ended the last one has finished: its client had its
        answer from that step. Only while waves have lately been seen to come back."""
        if first_arrival - self._returns_seen > self._memory_s:
            return False
        return -self._window_s < first_arrival - self._wave_ended < self._wave_return_s

    def alone(self) -> None:
        """A request waited for the rest of a burst and none came: requests come one at a time
        now, and the next ones do not wait."""
        self._burst_seen = self._wave_ended = self._returns_seen = -math.inf
