"""Benchmark chunked prefill and the prefix cache (engine/filling.py, prefix_cache.py), in-process.

Two measurements on the default model, each with the feature on and off, in interleaved turns
with the machine's load printed beside each:

- **A long prompt beside running streams.** `--streams` requests decode (a 39-token prompt,
  exactly `--stream-tokens` tokens); once they run, a `--long`-token prompt arrives. The
  streams' time per output token (the gap between a stream's tokens) is taken while they run
  alone before it came (steady) and while it is admitted (from its arrival to its first token);
  target: p90 during admission within 2x steady. Also its own time to first token.
- **A shared prefix.** A request with a `--prefix`-token start and 30 tokens of its own, then one
  with the same start and 30 others: the second's time to first token against the first's;
  target: at most 0.3x. A new start each turn.

Writes docs/benchmark-prefill.md. Usage (from the repo root):

    scripts/benchmark prefill [--turns 3] [--long 2000] [--prefix 1000]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from scripts.benchmarks import families

from tritonbox_triton.engine.attention import load_model
from tritonbox_triton.engine.dtype import engine_dtype
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.timings import DEFAULT_TIMINGS
from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.settings import DEFAULT_MODEL_NAME

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "benchmark-prefill.md"
STREAM_PROMPT = [1, *range(1000, 1038)]


class Sink(families.Sink):
    """families.py's sink, with the time each token came."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def on_tokens(self, tokens: list[int], logprobs: Any, finish: Any, top: Any = ()) -> None:
        self.times += [time.perf_counter()] * len(tokens)
        super().on_tokens(tokens, logprobs, finish, top)


def _send(engine: InflightBatcher, prompt: list[int], tokens: int) -> tuple[Sink, float]:
    sink = Sink()
    params = SamplingParams(max_tokens=tokens, min_tokens=tokens, end_id=-1, pad_id=0)
    sent = time.perf_counter()
    engine.submit(EngineRequest(list(prompt), params, sink, [], []))
    return sink, sent


def _wait(*sinks: Sink) -> None:
    while any(sink.done == 0.0 for sink in sinks):
        time.sleep(0.002)


def _random(length: int, generator: torch.Generator) -> list[int]:
    return torch.randint(100, 40000, (length,), generator=generator).tolist()


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] if ordered else float("nan")


def long_prompt_turn(engine: InflightBatcher, args: argparse.Namespace,
                     generator: torch.Generator) -> dict[str, float]:  # fmt: skip
    streams = [_send(engine, STREAM_PROMPT, args.stream_tokens)[0] for _ in range(args.streams)]
    while min(len(sink.times) for sink in streams) < 20:
        time.sleep(0.005)
    long_sink, arrived = _send(engine, _random(args.long, generator), 4)
    _wait(long_sink, *streams)
    first = long_sink.times[0]
    steady, during = [], []
    for sink in streams:
        for before, after in zip(sink.times, sink.times[1:], strict=False):
            if after <= before:
                continue  # tokens sent together (none below 8 streams)
            if after < arrived:
                steady.append(after - before)
            elif before >= arrived and after <= first + 1e-3:
                during.append(after - before)
            elif before < first < after:
                during.append(after - before)  # the step that finished the prompt
    return {"steady_p90": _p90(steady) * 1e3, "during_p90": _p90(during) * 1e3,
            "long_ttft": (first - arrived) * 1e3}  # fmt: skip


def prefix_turn(engine: InflightBatcher, args: argparse.Namespace,
                generator: torch.Generator) -> dict[str, float]:  # fmt: skip
    start = _random(args.prefix, generator)
    ttfts = []
    for _ in range(2):
        sink, sent = _send(engine, start + _random(30, generator), 4)
        _wait(sink)
        ttfts.append((sink.times[0] - sent) * 1e3)
    return {"first_ttft": ttfts[0], "second_ttft": ttfts[1], "ratio": ttfts[1] / ttfts[0]}


def page(results: dict[str, list[dict[str, float]]], args: argparse.Namespace,
         loads: list[str]) -> str:  # fmt: skip
    def med(name: str, key: str) -> float:
        return statistics.median(turn[key] for turn in results[name])

    def turns(name: str, key: str) -> str:
        return ", ".join(f"{turn[key]:.0f}" for turn in results[name])

    lines = [
        "# Chunked prefill and the prefix cache",
        "",
        f"`scripts/benchmark prefill --turns {args.turns} --long {args.long} --prefix "
        f"{args.prefix}` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
        f"{str(args.dtype).removeprefix('torch.')}, the default model in-process, engine "
        f"commit `{args.commit}`). Medians of {args.turns} interleaved turns (each turn's "
        "values in brackets).",
        "",
        f"## A {args.long}-token prompt arriving beside {args.streams} running streams",
        "",
        "Chunks sized from the observed cost of a step (filling.py's `ChunkBudget`; at most "
        f"{DEFAULT_TIMINGS.prefill_chunk_tokens} tokens). Time per output token of the running "
        "streams, p90, while they run alone (steady) and while the long prompt is admitted; "
        "target: at most 2x steady.",
        "",
        "| prefill | steady p90 (ms) | during admission p90 (ms) | ratio | its TTFT (ms) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, label in (("chunked", "in chunks"), ("one_pass", "one pass (chunks off)")):
        ratio = statistics.median(t["during_p90"] / t["steady_p90"] for t in results[name])
        lines.append(f"| {label} | {med(name, 'steady_p90'):.0f} ({turns(name, 'steady_p90')}) | "
                     f"{med(name, 'during_p90'):.0f} ({turns(name, 'during_p90')}) | "
                     f"{ratio:.2f}x | {med(name, 'long_ttft'):.0f} "
                     f"({turns(name, 'long_ttft')}) |")  # fmt: skip
    lines += [
        "",
        f"## A second request sharing a {args.prefix}-token start",
        "",
        "Time to first token of the first request and of a second with the same start; target: "
        "the second at most 0.3x the first.",
        "",
        "| prefix cache | first TTFT (ms) | second TTFT (ms) | second / first |",
        "|---|---:|---:|---:|",
    ]
    for name, label in (("cached", "on"), ("uncached", "off")):
        ratio = statistics.median(t["ratio"] for t in results[name])
        lines.append(f"| {label} | {med(name, 'first_ttft'):.0f} ({turns(name, 'first_ttft')}) | "
                     f"{med(name, 'second_ttft'):.0f} ({turns(name, 'second_ttft')}) | "
                     f"{ratio:.2f}x |")  # fmt: skip
    lines += ["", "Load average (1 min) before each turn: " + "; ".join(loads) + ".", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--stream-tokens", type=int, default=200)
    parser.add_argument("--long", type=int, default=2000)
    parser.add_argument("--prefix", type=int, default=1000)
    parser.add_argument("--page", type=Path, default=PAGE)
    args = parser.parse_args()
    args.dtype = engine_dtype("auto")
    args.commit = os.popen("git rev-parse --short HEAD").read().strip()
    torch.set_num_threads(1)  # the engines' own threads do the work
    model = load_model(prepare_default_model(REPO / ".cache" / "models" / DEFAULT_MODEL_NAME),
                       args.dtype)  # fmt: skip
    limits = EngineLimits(4096, 512, 65536)

    def engine(**timings: Any) -> InflightBatcher:
        chosen = dataclasses.replace(DEFAULT_TIMINGS, **timings)
        built = InflightBatcher(model, lambda ids: "", limits, max_batch_size=8, timings=chosen)
        built.start()
        return built

    engines = {
        "chunked": engine(prefix_cache_bytes=0),
        "one_pass": engine(prefix_cache_bytes=0, prefill_chunk_tokens=0),
        "cached": engine(prefill_chunk_tokens=0),
        "uncached": engine(prefix_cache_bytes=0, prefill_chunk_tokens=0),
    }
    generator = torch.Generator().manual_seed(20261127)
    for built in engines.values():  # warm: compiled kernels, first allocations
        _wait(_send(built, _random(300, generator), 4)[0])
    results: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    loads = []
    for turn in range(args.turns):
        loads.append(f"{os.getloadavg()[0]:.2f}")
        print(f"turn {turn + 1}/{args.turns}, load {loads[-1]}", file=sys.stderr)
        for name in ("chunked", "one_pass"):
            results[name].append(long_prompt_turn(engines[name], args, generator))
            print(f"  {name}: {results[name][-1]}", file=sys.stderr)
        for name in ("cached", "uncached"):
            results[name].append(prefix_turn(engines[name], args, generator))
            print(f"  {name}: {results[name][-1]}", file=sys.stderr)
    for built in engines.values():
        built.stop()
    args.page.write_text(page(results, args, loads))
    print(f"wrote {args.page}", file=sys.stderr)
    return 0
