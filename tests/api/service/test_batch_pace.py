"""The batch runner's pace (service/batch_pace.py): lines start spaced by the engine's step, as
the runner's recent lines saw it, never together."""

from __future__ import annotations

import pytest

from tritonbox_api.service import batch_pace
from tritonbox_api.service.batch_pace import FIRST_STEP_S, LINES_PER_STEP, SAMPLES, Pace


def test_lines_start_a_step_apart() -> None:
    pace = Pace()
    assert pace.wait_s(100.0) == 0  # the first at once
    pace.started(1, 100.0)
    step = FIRST_STEP_S / LINES_PER_STEP
    assert pace.wait_s(100.0) == pytest.approx(step)
    assert pace.wait_s(100.0 + step / 2) == pytest.approx(step / 2)
    assert pace.wait_s(100.0 + step) == 0
    pace.started(1, 100.0 + 5 * step)  # from when it started, not from when it could have
    assert pace.wait_s(100.0 + 5 * step) == pytest.approx(step)


def test_the_step_is_the_median_time_per_token_of_recent_lines() -> None:
    pace = Pace()
    assert pace.step_s == FIRST_STEP_S  # until a line has told
    pace.observe(None)  # a line of one token tells nothing
    pace.observe(0.0)
    assert pace.step_s == FIRST_STEP_S
    for each in (0.02, 0.021, 0.019, 0.9):  # one line held up: the median keeps the step
        pace.observe(each)
    assert pace.step_s == pytest.approx(0.0205)
    for _ in range(SAMPLES):  # only the recent lines count
        pace.observe(0.005)
    assert pace.step_s == pytest.approx(0.005)
    pace.started(1, 0.0)
    assert pace.wait_s(0.0) == pytest.approx(0.005 / LINES_PER_STEP)


def test_a_line_of_several_requests_and_several_workers_space_further(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(batch_pace, "LINES_PER_STEP", 1)
    pace = Pace()
    pace.started(3, 0.0)  # `n` = 3: three prompts reach the engine
    assert pace.wait_s(0.0) == pytest.approx(3 * FIRST_STEP_S)
    shared = Pace(workers=2)  # two api workers: each every other step
    shared.started(1, 0.0)
    assert shared.wait_s(0.0) == pytest.approx(2 * FIRST_STEP_S)
