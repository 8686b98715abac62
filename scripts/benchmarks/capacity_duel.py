"""TritonBox's capacity on the mixed workload against vLLM's best configuration, in turns.

The sweep (vllm_sweep.py) runs one server at a time, TritonBox a quarter of an hour after vLLM's
best: on a virtual machine whose speed drifts by tens of percent within that time, its two
capacities compare two moments as much as two servers. Here both servers are up side by side,
the one not being measured idle, and each round sends a set of the mixed workload's requests of
its own (no other phase sends them: a prefix cache meets no prompt twice) to one server and then
the same set to the other, the order turning each round. A round's ratio compares two runs a
minute apart at most; the headline is the median over the rounds. Beside each run: the cores the
rest of the machine used meanwhile, the idle server included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
from scripts.benchmarks.duel_report import TRITONBOX, VLLM, Round
from scripts.benchmarks.mixed_workload import MixedRequest
from scripts.benchmarks.open_loop import Send, capacity, completions
from scripts.benchmarks.proc import OthersLoad, process_tree
from scripts.benchmarks.servers import start_stack
from scripts.benchmarks.vllm_configs import CONFIGS, environment
from scripts.benchmarks.vllm_cpu import openai_path, run_batch
from scripts.benchmarks.vllm_env import VENV, start_vllm
from tritonbox_testing.ports import free_ports


async def _measured(
    name: str, send: Send, requests: Sequence[MixedRequest], streams: int, pids: list[int]
) -> tuple[float, float]:
    """The server's capacity on `requests`, and the others' load meanwhile (cores)."""
    others, started = OthersLoad(pids), time.perf_counter()
    result = await capacity(name, send, requests, streams)
    return result.tokens_per_s, others.cores(time.perf_counter() - started)


def duel(
    args: argparse.Namespace,
    folder: Path,
    stack_env: Callable[[argparse.Namespace, Path, list[int]], dict[str, str]],
) -> list[Round]:
    """Both servers up (vLLM in args.duel_config; TritonBox's stack as `stack_env(args, folder,
    ports)` sets it), then a round for each of args.sets' `duel-N` sets; none without vLLM.
    A failure is a note on the page (args.notes): the sweep's rows still count."""
    config = CONFIGS.get(args.duel_config or "")
    tuning = environment(config, VENV) if config is not None else None
    if config is None or tuning is None or args.executable is None or not args.duel_rounds:
        return []
    sets = [args.sets[f"duel-{index}"] for index in range(args.duel_rounds)]
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
            pids = {VLLM: vllm_pid, TRITONBOX: process.pid}
            return asyncio.run(_rounds(args, {VLLM: vllm_url, TRITONBOX: url}, pids, sets))
    except (RuntimeError, OSError, httpx.HTTPError) as error:
        args.notes.append(f"The capacity in turns failed: {str(error)[:300]}")
        print(args.notes[-1], file=sys.stderr)
        return []


async def _rounds(
    args: argparse.Namespace,
    urls: dict[str, str],
    roots: dict[str, int],  # each server's first process
    request_sets: Sequence[Sequence[MixedRequest]],
) -> list[Round]:
    async with httpx.AsyncClient(timeout=900, trust_env=False) as http:
        models = {VLLM: "model"}
        models[TRITONBOX] = (await http.get(f"{urls[TRITONBOX]}/v1/models")).json()["data"][0]["id"]
        sends = {name: completions(http, url, models[name]) for name, url in urls.items()}
        for name, url in urls.items():  # the closed loop's prompt: no prefix of these requests
            warm = openai_path(http, url, models[name])
            tree = process_tree(roots[name])
            await run_batch("warm-up", warm, args.streams, args.streams, 8, tree)
        rounds = []
        for index, requests in enumerate(request_sets):
            order = [VLLM, TRITONBOX] if index % 2 == 0 else [TRITONBOX, VLLM]
            got = {}
            for name in order:
                tree = process_tree(roots[name])
                got[name] = await _measured(name, sends[name], requests, args.streams, tree)
            rounds.append(Round(order[0], got[VLLM][0], got[TRITONBOX][0], got[VLLM][1],
                                got[TRITONBOX][1]))  # fmt: skip
            said = f"TritonBox {got[TRITONBOX][0]:.1f} against vLLM {got[VLLM][0]:.1f} tok/s"
            print(f"round {index + 1}: {said}: {rounds[-1].ratio:.2f}x", file=sys.stderr)
        return rounds
