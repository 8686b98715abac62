"""Benchmark the cpu engine's written-out step on each model family it knows, in-process.

For each family (engine/family.py) a model of SmolLM2-135M's shape is built from the family's
transformers config with random weights, so that every model reads about the same bytes per
step; SmolLM2-135M itself (the default model) is the yardstick. A decode step streams the
weights through the cores, so a model's tokens/s is predicted from SmolLM2's by the ratio of
their parameter counts; each row says how close it comes (target: at least 0.8×). Also measured:
SmolLM2 through the model's own forward (what a family without the written-out step costs), and
any checkpoint given with `--model` (the Gemma 3 270M package's, say), and SmolLM2 with its logits
rounded to bfloat16 by oneDNN's product, as before float_logits.py: what float32 logits cost.

The models are loaded once and run in turns, interleaved, with the machine's load average
printed beside each turn. Writes docs/benchmark-families.md. Usage (from the repo root):

    scripts/benchmark families [--tokens 64] [--turns 3] [--model PATH ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tritonbox_triton.engine.attention import load_model
from tritonbox_triton.engine.dtype import engine_dtype
from tritonbox_triton.engine.packed_layer import packed_linear
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.settings import DEFAULT_MODEL_NAME

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "benchmark-families.md"
PROMPT = [1, *range(1000, 1038)]  # 39 tokens, as the other cpu engine benchmarks' prompt
# What each family adds to SmolLM2's own config (its shape: hidden 576, 30 layers, 9 heads).
FAMILIES: dict[str, dict[str, Any]] = {
    "mistral": {},
    "qwen2": {},
    "qwen3": {},
    "gemma2": {"query_pre_attn_scalar": 64, "hidden_activation": "gelu_pytorch_tanh",
               "sliding_window": 512},
    "gemma3_text": {"query_pre_attn_scalar": 64, "hidden_activation": "gelu_pytorch_tanh",
                    "sliding_window": 512},
}  # fmt: skip
SHAPE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
              "rms_norm_eps", "tie_word_embeddings", "bos_token_id", "eos_token_id")  # fmt: skip


@dataclass
class Served:
    name: str
    family: str
    parameters: int
    engine: InflightBatcher
    rates: dict[int, list[float]] = field(default_factory=dict)  # concurrency -> tok/s per turn


class Sink:
    def __init__(self) -> None:
        self.tokens = 0
        self.done = 0.0

    def is_cancelled(self) -> bool:
        return False

    def on_tokens(
        self, tokens: list[int], logprobs: list[float], finish: Any, top: Any = ()
    ) -> None:
        self.tokens += len(tokens)
        if finish is not None:
            self.done = time.perf_counter()

    def on_error(self, message: str) -> None:
        raise RuntimeError(message)

    def on_cancelled(self) -> None:
        pass

    def on_prompt(self, scores: Any) -> None:
        pass


def build(family: str, like: Path, directory: Path) -> Path:
    """A random model of `family` with the shape of the checkpoint at `like`."""
    base = AutoConfig.from_pretrained(like)
    shape = {key: getattr(base, key) for key in SHAPE_KEYS}
    config = AutoConfig.for_model(family, **shape, head_dim=64, **FAMILIES[family])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(directory)
    return directory


def serve(
    name: str, checkpoint: Path, dtype: torch.dtype, forward: bool = False, rounded: bool = False
) -> Served:
    model = load_model(checkpoint, dtype)
    engine = InflightBatcher(model, lambda ids: "", EngineLimits(512, 512, 16384),
                             max_batch_size=8)  # fmt: skip
    if forward:
        engine._fast_step = None  # what a family without the written-out step runs
    if rounded and engine._fast_step is not None:  # bfloat16 logits, as before float_logits.py
        engine._fast_step._lm_head = packed_linear(model.lm_head.weight)
    engine.start()
    parameters = sum(p.numel() for p in model.parameters())
    return Served(name, model.config.model_type, parameters, engine)


def run(served: Served, concurrency: int, tokens: int) -> float:
    """Output tokens/s of `concurrency` requests of exactly `tokens` tokens sent at once."""
    sinks = [Sink() for _ in range(concurrency)]
    started = time.perf_counter()
    for sink in sinks:
        params = SamplingParams(max_tokens=tokens, min_tokens=tokens, end_id=-1, pad_id=0)
        served.engine.submit(EngineRequest(list(PROMPT), params, sink, [], []))
    while any(sink.done == 0.0 for sink in sinks):
        time.sleep(0.005)
    return sum(sink.tokens for sink in sinks) / (max(s.done for s in sinks) - started)


def page(models: list[Served], args: argparse.Namespace, loads: list[str]) -> str:
    yardstick = models[0]
    lines = [
        "# The cpu engine on each model family",
        "",
        f"`scripts/benchmark families --tokens {args.tokens} --turns {args.turns}` "
        f"({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, dtype "
        f"{str(args.dtype).removeprefix('torch.')}). Each family's model has SmolLM2-135M's shape "
        "and random weights; in-process engine, requests of a 39-token prompt and exactly "
        f"{args.tokens} tokens sent at once, tok/s the median of {args.turns} interleaved turns. "
        "*Predicted* is SmolLM2's tok/s scaled by the ratio of parameter counts (a step reads "
        "every weight once); *ratio* is the median over turns of each turn's tok/s against "
        "that turn's prediction. The target is a ratio of at least 0.8.",
        "",
        "| model | family | parameters | streams | tok/s (turns) | predicted | ratio |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    for served in models:
        for concurrency, rates in served.rates.items():
            scale = yardstick.parameters / served.parameters
            predicted = [base * scale for base in yardstick.rates[concurrency]]
            # Each turn's ratio against the yardstick's in the same turn: the machine's load
            # moves between turns more than within one.
            ratio = statistics.median(r / p for r, p in zip(rates, predicted, strict=True))
            turns = ", ".join(f"{rate:.0f}" for rate in rates)
            lines.append(f"| {served.name} | {served.family} | {served.parameters / 1e6:.0f}M | "
                         f"{concurrency} | {statistics.median(rates):.1f} ({turns}) | "
                         f"{statistics.median(predicted):.1f} | {ratio:.2f}× |")  # fmt: skip
    lines += ["", "Load average (1 min) before each turn: " + "; ".join(loads) + ".", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--model", type=Path, action="append", default=[],
                        help="another checkpoint folder to measure")  # fmt: skip
    parser.add_argument("--page", type=Path, default=PAGE)
    args = parser.parse_args()
    args.dtype = engine_dtype("auto")
    torch.set_num_threads(1)  # the engines' own threads do the work (scheduler.start)
    smollm2 = prepare_default_model(REPO / ".cache" / "models" / DEFAULT_MODEL_NAME)
    with tempfile.TemporaryDirectory() as scratch:
        models = [serve("SmolLM2-135M-Instruct", smollm2, args.dtype)]
        for family in FAMILIES:
            folder = build(family, smollm2, Path(scratch) / family)
            models.append(serve(f"random {family}", folder, args.dtype))
        models += [serve(path.name, path, args.dtype) for path in args.model]
        models.append(serve("SmolLM2, model's forward", smollm2, args.dtype, forward=True))
        models.append(serve("SmolLM2, bfloat16 logits", smollm2, args.dtype, rounded=True))
        for served in models:  # warm: compiled kernels, first allocations
            run(served, 2, 8)
        loads = []
        for turn in range(args.turns):
            loads.append(f"{os.getloadavg()[0]:.2f}")
            print(f"turn {turn + 1}/{args.turns}, load {loads[-1]}", file=sys.stderr)
            for served in models:
                for concurrency in args.concurrency:
                    rate = run(served, concurrency, args.tokens)
                    served.rates.setdefault(concurrency, []).append(rate)
                    print(f"  {served.name} ×{concurrency}: {rate:.1f} tok/s", file=sys.stderr)
        for served in models:
            served.engine.stop()
    args.page.write_text(page(models, args, loads))
    print(f"wrote {args.page}", file=sys.stderr)
    return 0
