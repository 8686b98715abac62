"""TritonBox against vLLM's best configuration in turns, both servers up side by side.

The sweep (vllm_sweep.py) runs one server at a time, TritonBox a quarter of an hour after vLLM's
best: on a virtual machine whose speed drifts by tens of percent within that time, two such
figures compare two moments as much as two servers. Here the server not being measured sits
idle, and each round sends a set of requests to one server and then the same set to the other,
the order turning each round, in three parts:

1. capacity on the mixed workload: a `duel-N` set, `streams` at a time;
2. the open loop at `peer_rate` of vLLM's capacity as part 1 measured it (the median of its
   rounds): a `duel-open-N` set at Poisson arrivals, each server's TTFT p50 and p90;
3. the closed loop (with `--workload both` or `closed`): the sweep's batch at each level.

The mixed sets are the rounds' own (no other phase sends them: a prefix cache meets no prompt
twice). A round's ratio compares two runs minutes apart; the headline is the median over the
rounds. Beside each run: the cores the rest of the machine used meanwhile, the idle server
included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import httpx
from scripts.benchmarks.duel_report import CAPACITY, OPEN, TRITONBOX, VLLM, Duel, Round, Run
from scripts.benchmarks.mixed_workload import MixedRequest, mean_output
from scripts.benchmarks.open_loop import Send, capacity, completions, open_loop, pct
from scripts.benchmarks.open_loop_report import Turn, best_closed_config, best_config
from scripts.benchmarks.proc import OthersLoad, cpu_seconds, process_tree
from scripts.benchmarks.servers import start_stack
from scripts.benchmarks.vllm_configs import CONFIGS, environment
from scripts.benchmarks.vllm_cpu import openai_path, run_batch
from scripts.benchmarks.vllm_env import VENV, start_vllm
from tritonbox_testing.ports import free_ports

Measure = Callable[[str], Awaitable[Run]]  # one server's run of a round, by server name
# Each run starts once neither server has used more than this share of a core over a window:
# vLLM's processes keep about one core busy for a second after their last request ends (0.5 of
# a core over the 2 s after a burst, 0.02 later; TritonBox's 0.03), which ran into TritonBox's
# runs when vLLM went first.
QUIET_CORES, QUIET_WINDOW_S, QUIET_MOST_S = 0.05, 0.5, 15.0


def duel(
    args: argparse.Namespace,
    turns: Sequence[Turn],
    folder: Path,
    stack_env: Callable[[argparse.Namespace, Path, list[int]], dict[str, str]],
) -> Duel | None:
    """Both servers up (vLLM in the configuration of `turns` with the most capacity, else the
    most tok/s at the busiest closed-loop level; TritonBox's stack as `stack_env(args, folder,
    ports)` sets it), then args.duel_rounds rounds of each part; None without vLLM. A failure
    is a note on the page (args.notes): the sweep's rows still count."""
    best = best_config(turns) or best_closed_config(turns, max(args.concurrency))
    config = CONFIGS.get(best or "")
    tuning = environment(config, VENV) if config is not None else None
    if config is None or tuning is None or args.executable is None or not args.duel_rounds:
        return None
    sequences, length, _ = args.limits
    (folder / "vllm").mkdir(parents=True, exist_ok=True)
    try:
        with contextlib.ExitStack() as stack:
            vllm_url, vllm_pid, _ = start_vllm(
                stack, args.executable, args.model_dir, folder / "vllm", max_seqs=sequences,
                max_model_len=length, tuning=tuning, extra_args=config.args,
            )  # fmt: skip
            ports = free_ports(4)
            process, url, _ = start_stack(stack, folder / "stack", stack_env(args, folder, ports))
            urls, roots = {VLLM: vllm_url, TRITONBOX: url}, {VLLM: vllm_pid, TRITONBOX: process.pid}
            return asyncio.run(_rounds(args, config.name, urls, roots))
    except (RuntimeError, OSError, httpx.HTTPError) as error:
        args.notes.append(f"The servers in turns failed: {str(error)[:300]}")
        print(args.notes[-1], file=sys.stderr)
        return None


async def _quiet(roots: dict[str, int]) -> None:
    """Until both servers are idle (QUIET_CORES), at most QUIET_MOST_S."""
    deadline = time.monotonic() + QUIET_MOST_S
    while time.monotonic() < deadline:
        pids = [pid for name in roots for pid in _tree(roots, name)]
        before = cpu_seconds(pids)
        await asyncio.sleep(QUIET_WINDOW_S)
        if cpu_seconds(pids) - before <= QUIET_CORES * QUIET_WINDOW_S:
            return


async def _in_turns(part: str, index: int, measure: Measure, roots: dict[str, int]) -> Round:
    order = [VLLM, TRITONBOX] if index % 2 == 0 else [TRITONBOX, VLLM]
    got = {}
    for name in order:
        await _quiet(roots)
        got[name] = await measure(name)
    result = Round(part, order[0], got[VLLM], got[TRITONBOX])
    print(f"{part} round {index + 1}: TritonBox {result.ratio:.2f}x vLLM", file=sys.stderr)
    return result


async def _rounds(
    args: argparse.Namespace,
    config: str,
    urls: dict[str, str],
    roots: dict[str, int],  # each server's first process
) -> Duel:
    async with httpx.AsyncClient(timeout=900, trust_env=False) as http:
        models = {VLLM: "model"}
        models[TRITONBOX] = (await http.get(f"{urls[TRITONBOX]}/v1/models")).json()["data"][0]["id"]
        sends = {name: completions(http, url, models[name]) for name, url in urls.items()}
        closed = {name: openai_path(http, url, models[name]) for name, url in urls.items()}
        for name in urls:  # the closed loop's prompt: no prefix of the mixed requests
            tree = _tree(roots, name)
            await run_batch("warm-up", closed[name], args.streams, args.streams, 8, tree)
        rounds: list[Round] = []
        mixed = args.workload != "closed"
        for index in range(args.duel_rounds if mixed else 0):
            requests = args.sets[f"duel-{index}"]

            async def saturated(name: str, requests: Sequence[MixedRequest] = requests) -> Run:
                others, started = OthersLoad(_tree(roots, name)), time.perf_counter()
                result = await capacity(name, sends[name], requests, args.streams)
                return Run(result.tokens_per_s, others.cores(time.perf_counter() - started))

            rounds.append(await _in_turns(CAPACITY, index, saturated, roots))
        rate, pooled = 0.0, (math.nan, math.nan)
        if mixed and args.peer_rate:
            rate, pooled = await _open_rounds(args, rounds, sends, roots)
        if args.workload != "open-loop":
            for level in args.concurrency:
                count = max(args.min_requests, level * args.waves)
                for index in range(args.duel_rounds):

                    async def batch(name: str, level: int = level, count: int = count) -> Run:
                        tree = _tree(roots, name)
                        done = await run_batch(name, closed[name], level, count, args.tokens, tree)
                        return Run(done.tokens_per_s, done.others)

                    rounds.append(await _in_turns(str(level), index, batch, roots))
        return Duel(config, rounds, rate, args.peer_rate if rate else 0.0, pooled)


async def _open_rounds(
    args: argparse.Namespace, rounds: list[Round], sends: dict[str, Send], roots: dict[str, int]
) -> tuple[float, tuple[float, float]]:
    """The open loop in turns at args.peer_rate of vLLM's capacity as `rounds` measured it,
    its rounds added to them; the rate, and each server's TTFT p90 over all its requests."""
    capacities = [r for r in rounds if r.part == CAPACITY]
    per_s = [r.vllm.tokens_per_s / mean_output(args.sets[f"duel-{i}"])  # requests/s
             for i, r in enumerate(capacities)]  # fmt: skip
    rate = args.peer_rate * statistics.median(per_s)
    ttfts: dict[str, list[float]] = {VLLM: [], TRITONBOX: []}
    for index in range(args.duel_rounds):
        requests = args.sets[f"duel-open-{index}"]

        async def arrivals(name: str, requests: Sequence[MixedRequest] = requests) -> Run:
            run = await open_loop(name, sends[name], requests, rate, OPEN, _tree(roots, name))
            ms = [o.ttft * 1000 for o in run.outcomes]
            ttfts[name] += ms
            return Run(run.tokens_per_s, run.others, pct(ms, 50), pct(ms, 90))

        rounds.append(await _in_turns(OPEN, index, arrivals, roots))
    return rate, (pct(ttfts[VLLM], 90), pct(ttfts[TRITONBOX], 90))


def _tree(roots: dict[str, int], name: str) -> list[int]:
    return process_tree(roots[name])
