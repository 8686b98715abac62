"""`scripts/benchmark NAME [options]`: run one benchmark and write its page under docs/.

scripts/benchmark --list             what there is
scripts/benchmark api --help         one benchmark's options
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# name → (module, what it measures, the page it writes)
BENCHMARKS = {
    "api": (
        "api",
        "what the api proxy costs over direct gRPC (synthetic engine)",
        "benchmark-api.md",
    ),
    "workers": (
        "workers",
        "API_WORKERS scaling on SQLite and PostgreSQL (synthetic engine)",
        "benchmark-workers.md",
    ),
    "lora": (
        "lora",
        "batches over 4 LoRA adapters against the bare base (cpu engine); adapter load time",
        "benchmark-lora.md",
    ),
    "idle": ("idle", "CPU of every process of the native stack with no traffic", "idle.md"),
    "abuse": (
        "abuse",
        "hostile requests beside 4 interactive streams: answers, TTFT, memory (cpu engine)",
        "abuse.md",
    ),
    "cpu-engine": (
        "cpu_engine",
        "the cpu engine's tokens/s against transformers generate() (default model)",
        "benchmark-cpu-engine.md",
    ),
    "families": (
        "families",
        "the cpu engine's step on each model family, against SmolLM2's bytes per step",
        "benchmark-families.md",
    ),
    "prefill": (
        "prefill",
        "chunked prefill beside running streams and the prefix cache (cpu engine, in-process)",
        "benchmark-prefill.md",
    ),
    "vllm-cpu": (
        "vllm_cpu",
        "the cpu engine against vLLM's CPU build, through the api and Triton (default model)",
        "benchmark-vllm-cpu.md",
    ),
    "batch": (
        "batch",
        "a batch's throughput alone, and live TTFT beside a running batch (cpu engine)",
        "benchmark-batch.md",
    ),
}


def usage() -> str:
    lines = ["usage: scripts/benchmark NAME [options]   (NAME --help for its options)", ""]
    lines += [f"  {name:<11} {what}  → docs/{page}" for name, (_, what, page) in BENCHMARKS.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help", "--list"}:
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    # The modules import each other as `scripts.benchmarks.…` (as mypy names them). `scripts` is
    # registered as a package by hand rather than putting the repo root on the path, where its
    # `triton/` folder would pass for the `triton` package that torch imports.
    scripts = types.ModuleType("scripts")
    scripts.__path__ = [str(REPO / "scripts")]
    sys.modules.setdefault("scripts", scripts)
    sys.path.append(str(REPO / "tests" / "support"))  # the tests' PostgreSQL harness (workers)
    module = importlib.import_module(f"scripts.benchmarks.{BENCHMARKS[name][0]}")
    sys.argv = [f"scripts/benchmark {name}", *rest]  # argparse's prog and the pages' command line
    return int(module.main())


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
