"""When the batch runner may start its next line: lines reach the engine spread out, one or a
few an engine step, never as a burst (docs/batches.md, "Live traffic first").

Why: the cpu engine prefills what came together in passes nothing interrupts. Lines of one
length started together end together, and their replacements went out together: sixteen
prompts the engine took at once, prefilled nine then seven (100-155 ms a pass on 2 cores), and
a live request that came meanwhile waited for the pass in progress; stopping the lines takes
only those still in the engine's queue. Started at most LINES_PER_STEP an engine step, lines
are taken between the engine's decode steps in passes of one prompt, the longest a live request
can find in progress. Lines started apart end apart (those of one length as they began), and
each one's replacement starts as it ends, so the spacing, once made, stays; after a pause for
live traffic the lines fill the engine again at this pace.

The step is observed, not assumed: the median time per output token of the worker's recent
lines (their predictions' `time_per_output_token_s`, the engine's iteration as a running line
sees it: its decode step and the prefill passes between), FIRST_STEP_S until a line has told.
With several api workers, each starts lines `workers` times as far apart: together they keep
the pace of one.
"""

from __future__ import annotations

import statistics
from collections import deque

# New lines an api starts per engine step. One: the engine then prefills each line in a pass of
# its own (~35 ms on 2 cores, against 100-155 ms for nine together), which costs the batch the
# pass's fixed part (~22 ms) once per line instead of once per nine; measured in
# docs/benchmark-batch.md (a batch alone against the closed loop).
LINES_PER_STEP = 1
# The step before any line has told its time per token: the cpu engine's decode step at a full
# batch of 16 on 2 cores (~33 ms; 489 tok/s in docs/benchmark-batch.md's closed loop).
FIRST_STEP_S = 0.03
SAMPLES = 16  # the recent lines whose time per token sets the step


class Pace:
    def __init__(self, workers: int = 1) -> None:
        self._workers = max(1, workers)
        self._per_token: deque[float] = deque(maxlen=SAMPLES)
        self._next = float("-inf")  # time.monotonic() from which the next line may start

    def observe(self, per_token_s: float | None) -> None:
        """A line's prediction ended having spent `per_token_s` on each token after its first
        (None: it made fewer than two)."""
        if per_token_s is not None and per_token_s > 0:
            self._per_token.append(per_token_s)

    @property
    def step_s(self) -> float:
        """The engine's step as recent lines saw it."""
        return statistics.median(self._per_token) if self._per_token else FIRST_STEP_S

    def wait_s(self, now: float) -> float:
        """How long until the next line may start (0: now)."""
        return max(0.0, self._next - now)

    def started(self, slots: int, now: float) -> None:
        """A line of `slots` engine requests started at `now`: the next one waits its share of
        steps (a line of `n` choices is `n` prompts in the engine's queue)."""
        self._next = now + max(1, slots) * self._workers * self.step_s / LINES_PER_STEP
