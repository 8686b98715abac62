"""The open-loop benchmark's maths (scripts/benchmarks/open_loop.py, open_loop_report.py) on
made-up outcomes: the capacity while every stream is busy, percentiles, the best vLLM
configuration and the ratios set against it; no server, no timing."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

import pytest
from tritonbox_testing.repo_scripts import script_module


@pytest.fixture(scope="module")
def bench() -> tuple[ModuleType, ModuleType]:
    client = script_module("scripts.benchmarks.open_loop")
    return client, script_module("scripts.benchmarks.open_loop_report")


def test_capacity_counts_only_while_every_stream_is_busy(
    bench: tuple[ModuleType, ModuleType],
) -> None:
    client, _ = bench
    # Sent at 0 and 10 s; the first: first token at 1 s, 101 tokens by 21 s (5 tok/s after the
    # first); until 10 s it made 1 + 100 × 9/20 = 46. The second's first token comes after 10 s.
    outcomes = [client.Outcome(0.0, 1.0, 21.0, 101, 50), client.Outcome(10.0, 1.0, 5.0, 40, 50)]
    assert client.busy_tokens_per_s(outcomes) == pytest.approx(4.6)


def test_percentiles_interpolate(bench: tuple[ModuleType, ModuleType]) -> None:
    client, _ = bench
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert client.pct(values, 50) == pytest.approx(5.5)
    assert client.pct(values, 90) == pytest.approx(9.1)
    assert client.pct([3.0], 90) == 3.0


def test_tritonbox_is_set_against_the_best_configuration(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    client, report = bench

    def run(label: str, ttft: float, tokens_per_s: float) -> object:
        outcomes = [client.Outcome(0.0, ttft, 10.0, 100, 50)] * 10
        return client.OpenRun(label, 2.0, 1000 / tokens_per_s, outcomes, 0.01)

    def turn(server: str, config: str, capacity: float, ttft: float) -> object:
        made = report.Turn(server, config, 60.0)
        made.capacity = client.Capacity(16, capacity, capacity / 100, [])
        made.runs = [run("80% of its capacity", ttft, capacity * 0.8)]
        made.memory = {"all": (2 * 2**30, 3 * 2**30)}
        return made

    turns = [
        turn("vLLM pinned", "pinned", 300.0, 0.2),
        turn("vLLM default", "default", 250.0, 0.1),  # lower capacity: not the best
        turn("TritonBox api", "TritonBox", 330.0, 0.3),
    ]
    assert report.best_capacity(turns) == pytest.approx(3.0)  # pinned's, in requests/s
    args = argparse.Namespace(
        limits=(16, 3072, 2**30), configs=["default", "pinned"], tokens=128, waves=4,
        min_requests=32, seed=45, capacity_requests=64, streams=16, requests=10, repeats=1,
        concurrency=[1], revision="abc1234", notes=["A note"],
    )  # fmt: skip
    text = report.page(turns, args, 60.0)
    assert "best here (pinned, by capacity)" in text
    assert "TritonBox 330.0 tok/s against 300.0: **1.10×**" in text
    # TTFT p90 300 ms against pinned's 200 ms, not default's 100 ms.
    row = "| 80% of its capacity | TritonBox api | 2.00 | 264.0 | 300 | 300 | 10.0 | 0.01 |"
    assert f"{row} **1.50** |" in text
    assert "at abc1234 (" in text and text.endswith("\nA note.\n")
    assert "In turns" not in text  # no rounds run: no section
    assert "(pinned), resident after the run: 2.00 / 2.00 GiB = **1.00×**" in text


def test_a_closed_loop_of_one_wave_has_no_steady_ttft_to_compare(
    bench: tuple[ModuleType, ModuleType],
) -> None:
    """--waves 1: every request is in the first wave, so the TTFT after it is not measured; the
    page shows "–" for it (not 0) instead of dividing by zero (which lost a 20-minute run's
    page)."""
    _, report = bench
    from scripts.benchmarks.vllm_report import Batch

    def turn(server: str, config: str, ttft: float, wall: float) -> object:
        made = report.Turn(server, config, 60.0)
        made.closed = [Batch(server, 8, wall, [(ttft, 128, 2.0)] * 8, 0.01)]
        return made

    turns = [turn("vLLM pinned", "pinned", 0.2, 4.0), turn("TritonBox api", "TritonBox", 0.1, 3.2)]
    lines = report.closed_section(turns, [8])
    assert "| 8 | pinned | 256.0 | 320.0 | **1.25** | – → – | – | 200 → 100 |" in lines
    assert "| 8 | pinned | 256.0 | – | 200 | 14.2 |" in lines


def test_each_part_in_turns_is_the_median_of_each_rounds_ratio(
    bench: tuple[ModuleType, ModuleType],
) -> None:
    """A round's ratio sets TritonBox against vLLM's run of the same round, not against the
    median of vLLM's runs: a slow minute of the machine's counts on both sides of its round.
    In the open loop the ratio is of TTFT p90 (lower is better), elsewhere of tok/s."""
    duel_report = script_module("scripts.benchmarks.duel_report")
    Round, Run, Duel = duel_report.Round, duel_report.Run, duel_report.Duel

    def capacity(first: str, vllm: float, ours: float, others: float = 0.01) -> object:
        return Round("capacity", first, Run(vllm, 0.02), Run(ours, others))

    def arrivals(first: str, vllm_p90: float, ours_p90: float) -> object:
        return Round("open", first, Run(130.0, 0.02, 150.0, vllm_p90),
                     Run(128.0, 0.03, 200.0, ours_p90))  # fmt: skip

    rounds = [
        capacity("vLLM", 300.0, 270.0, 0.03),  # 0.90
        capacity("TritonBox", 200.0, 220.0),  # 1.10: the machine slow, both slower
        capacity("vLLM", 310.0, 341.0),  # 1.10
        arrivals("vLLM", 400.0, 600.0),  # 1.50
        arrivals("TritonBox", 500.0, 500.0),  # 1.00
        Round("16", "vLLM", Run(360.0, 0.01), Run(396.0, 0.02)),  # 1.10
        Round("16", "TritonBox", Run(350.0, 0.01), Run(315.0, 0.02)),  # 0.90
    ]
    duel = Duel("pinned", rounds, 1.42, 0.8, (450.0, 585.0))
    lines = duel_report.section(duel, 16, 40, 40)
    assert "### In turns: TritonBox's api against vLLM pinned, both up" in lines
    assert "| 2 | TritonBox | 200.0 | 220.0 | 1.10 | 0.02 / 0.01 |" in lines
    # Medians of each side apart would give 300 / 270 = 0.90 instead.
    assert "Median over 3 rounds: **1.10×** vLLM's capacity (rounds 0.90–1.10×)." in lines
    text = "\n".join(lines)
    assert "**Open loop at 80% of vLLM's capacity** (the capacity rounds' median, 1.42" in text
    assert "| 1 | vLLM | 150 / 400 | 200 / 600 | 1.50 | 130.0 / 128.0 | 0.02 / 0.03 |" in lines
    assert "Median over 2 rounds: **1.25×** vLLM's TTFT p90 (rounds 1.00–1.50×)." in lines
    assert "TTFT p90 450 ms (vLLM) against 585 ms (TritonBox), **1.30×**." in text
    assert "| 16 | 2 | TritonBox | 350.0 | 315.0 | 0.90 | 0.01 / 0.02 |" in lines
    assert "- 16 streams: Median over 2 rounds: **1.00×** vLLM's tok/s (rounds 0.90–1.10×)." in text
    assert duel_report.section(None, 16, 40, 40) == []
    assert duel_report.section(Duel("pinned", []), 16, 40, 40) == []


def test_the_closed_loops_best_configuration_is_the_one_with_most_tokens(
    bench: tuple[ModuleType, ModuleType],
) -> None:
    """With no open loop run (`--workload closed`), the servers in turns set TritonBox against
    the configuration of the most tok/s at the busiest level."""
    _, report = bench
    from scripts.benchmarks.vllm_report import Batch

    def turn(config: str, wall_1: float, wall_16: float) -> object:
        made = report.Turn(f"vLLM {config}", config, 60.0)
        made.closed = [
            Batch(f"vLLM {config}", 1, wall_1, [(0.05, 128, 4.0)], 0.01),
            Batch(f"vLLM {config}", 16, wall_16, [(0.2, 128, 6.0)] * 16, 0.01),
        ]
        return made  # fmt: skip

    turns = [turn("pinned", 3.0, 6.0), turn("tcmalloc", 4.0, 5.0)]
    assert report.best_closed_config(turns, 16) == "tcmalloc"
    assert report.best_closed_config(turns, 1) == "pinned"
    assert report.best_closed_config(turns, 4) is None
    assert report.best_config(turns) is None  # no capacity measured
