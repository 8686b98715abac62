"""Benchmark the cpu engine through Triton against transformers' generate(), side by side.

Measures, in one run on one machine:
- through Triton (ensemble, gRPC streaming): output tokens/s, time to first token (TTFT), time
  per output token (TPOT) and end-to-end latency at concurrency 1, 4, 8 and 16;
- transformers generate() on the same prompts and checkpoint: one request at a time, and as one
  static batch;
- a request arriving while 8 others decode: its TTFT against its own prefill time and the
  8-wide decode step time measured in-process.
Writes a Markdown table to docs/benchmark-cpu-engine.md. Usage (from the repo root):

    scripts/benchmark cpu-engine [--tokens 48] [--concurrency 1 4 8 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from scripts.benchmarks.servers import start_cpu_engine
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from tritonbox_common.client import Generation, GenerationRequest, TritonLLMClient

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity to a child.",
    "List three uses of copper.",
    "Why is the sky blue?",
    "Describe a cat in two sentences.",
    "What does a compiler do?",
    "Give me a tip for learning Spanish.",
]


@dataclass
class Row:
    name: str
    concurrency: int
    requests: int
    tokens: int
    wall_s: float
    ttft_s: list[float]
    tpot_s: list[float]
    e2e_s: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def prompts(tokenizer: PreTrainedTokenizerBase, count: int) -> list[str]:
    return [
        str(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                tokenize=False,
                add_generation_prompt=True,
            )
        )
        for i in range(count)
    ]


async def triton_round(url: str, texts: list[str], concurrency: int, tokens: int) -> Row:
    client = TritonLLMClient(url)
    gate = asyncio.Semaphore(concurrency)

    async def one(text: str) -> Generation:
        async with gate:
            # min_tokens = max_tokens: every request decodes the same number of tokens.
            sampling: dict[str, float | int | bool] = {"min_tokens": tokens}
            return await client.generate(GenerationRequest(text, tokens, sampling=sampling))

    started = time.perf_counter()
    results = await asyncio.gather(*(one(text) for text in texts))
    wall = time.perf_counter() - started
    await client.close()
    ttft = [r.time_to_first_token_s or r.total_time_s for r in results]
    tpot = [
        (r.total_time_s - t) / max(1, len(r.ids) - 1) for r, t in zip(results, ttft, strict=True)
    ]
    return Row(
        "triton cpu engine", concurrency, len(texts), sum(len(r.ids) for r in results), wall,
        ttft, tpot, [r.total_time_s for r in results],
    )  # fmt: skip


def generate_rows(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str], tokens: int
) -> list[Row]:
    rows = []
    with torch.inference_mode():
        started = time.perf_counter()
        e2e = []
        for text in texts:
            ids = tokenizer(text, return_tensors="pt").input_ids
            t0 = time.perf_counter()
            model.generate(  # type: ignore[operator]
                ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False
            )
            e2e.append(time.perf_counter() - t0)
        wall = time.perf_counter() - started
        rows.append(
            Row("generate(), one at a time", 1, len(texts), tokens * len(texts), wall, [], [], e2e)
        )

        tokenizer.padding_side = "left"
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        started = time.perf_counter()
        model.generate(  # type: ignore[operator]
            **batch, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False
        )
        wall = time.perf_counter() - started
        rows.append(
            Row(
                "generate(), static batch",
                len(texts),
                len(texts),
                tokens * len(texts),
                wall,
                [],
                [],
                [wall],
            )
        )
    return rows


def step_costs(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, text: str, rows: int
) -> tuple[float, float]:
    """In-process prefill time of `text` and the decode step time of a `rows`-wide batch."""
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.inference_mode():
        timings = []
        for _ in range(3):
            t0 = time.perf_counter()
            model(
                input_ids=ids, past_key_values=DynamicCache(config=model.config), logits_to_keep=1
            )
            timings.append(time.perf_counter() - t0)
        prefill = min(timings)
        cache = DynamicCache(config=model.config)
        batch = ids.repeat(rows, 1)
        model(input_ids=batch, past_key_values=cache)
        timings = []
        for step in range(5):
            t0 = time.perf_counter()
            positions = torch.full((rows, 1), ids.shape[1] + step)
            model(input_ids=batch[:, :1], position_ids=positions, past_key_values=cache)
            timings.append(time.perf_counter() - t0)
    return prefill, statistics.median(timings)


async def arrival_under_load(url: str, background: list[str], probe: str, tokens: int) -> float:
    """TTFT of one request sent while len(background) others are decoding."""
    client = TritonLLMClient(url)
    long_sampling: dict[str, float | int | bool] = {"min_tokens": tokens * 3}
    running = [
        asyncio.create_task(
            client.generate(GenerationRequest(text, tokens * 3, sampling=long_sampling))
        )
        for text in background
    ]
    await asyncio.sleep(4.0)  # let every background request reach its decode phase
    probe_result = await client.generate(GenerationRequest(probe, 4))
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    await client.close()
    return probe_result.time_to_first_token_s or probe_result.total_time_s


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f}" if values else "–"


def report(rows: list[Row], tokens: int, probe: tuple[float, float, float], threads: int) -> str:
    single = next(r for r in rows if r.name.startswith("triton") and r.concurrency == 1)
    one_at_a_time = next(r for r in rows if r.name == "generate(), one at a time")
    lines = [
        "# CPU engine benchmark",
        "",
        f"Produced by `scripts/benchmark cpu-engine` on {time.strftime('%Y-%m-%d')}: "
        f"{torch.get_num_threads()} torch threads in the benchmark process, engine threads "
        f"{threads or 'all cores'}; SmolLM2-135M-Instruct fp32; {tokens} output tokens per request "
        "(min_tokens = max_tokens); chat prompts of 30-40 tokens. Triton numbers are over gRPC "
        "streaming through the whole ensemble. Every row was measured in the same run.",
        "",
        "| path | concurrency | requests | output tok/s | × single stream "
        "| TTFT p50 ms | TPOT p50 ms | e2e p50 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.name} | {row.concurrency} | {row.requests} | {row.tokens_per_s:.1f} | "
            f"{row.tokens_per_s / single.tokens_per_s:.2f} | {median_ms(row.ttft_s)} | "
            f"{median_ms(row.tpot_s)} | {median_ms(row.e2e_s)} |"
        )
    ttft, prefill, step = probe
    batch_8 = next(r for r in rows if r.name.startswith("triton") and r.concurrency == 8)
    lines += [
        "",
        "## Targets",
        "",
        f"- Concurrency 8 vs single stream: "
        f"{batch_8.tokens_per_s / single.tokens_per_s:.2f}× (target ≥ 4×).",
        f"- Single stream vs generate() one at a time: "
        f"{single.tokens_per_s / one_at_a_time.tokens_per_s:.2f}× (target ≥ 0.90×).",
        f"- A request arriving while 8 others decode: TTFT {ttft * 1000:.0f} ms = its prefill "
        f"({prefill * 1000:.0f} ms) + {(ttft - prefill) / step:.2f} decode steps of "
        f"{step * 1000:.0f} ms (target ≤ 2 steps).",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmark-cpu-engine.md")
    args = parser.parse_args()

    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as servers:
        batch_size = max(max(args.concurrency), 9)  # the arrival test runs 8 + 1 at once
        settings = start_cpu_engine(servers, Path(folder), batch_size)
        tokenizer = AutoTokenizer.from_pretrained(settings.resolved_model_dir)
        url = settings.grpc_url
        asyncio.run(triton_round(url, prompts(tokenizer, 2), 1, 8))  # warm-up
        for concurrency in args.concurrency:
            texts = prompts(tokenizer, max(4, 2 * concurrency))
            rows.append(asyncio.run(triton_round(url, texts, concurrency, args.tokens)))
            print(f"triton c={concurrency}: {rows[-1].tokens_per_s:.1f} tok/s", file=sys.stderr)
        texts = prompts(tokenizer, 9)
        ttft = asyncio.run(arrival_under_load(url, texts[:8], texts[8], args.tokens))
    model = AutoModelForCausalLM.from_pretrained(settings.resolved_model_dir, dtype=torch.float32)
    model.eval()
    rows += generate_rows(model, tokenizer, prompts(tokenizer, 8), args.tokens)
    prefill, step = step_costs(model, tokenizer, prompts(tokenizer, 9)[8], 8)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report(rows, args.tokens, (ttft, prefill, step), settings.cpu_threads))
    print(args.output.read_text())
    return 0
