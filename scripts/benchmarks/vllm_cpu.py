"""Benchmark the cpu engine against vLLM's CPU build on the same machine, side by side.

One server at a time, and the servers take turns: each repeat starts vLLM (bf16, 2 OpenMP
threads) and measures it, stops it, then starts TritonBox (tritonserver with the cpu engine, and
the api) and measures it through the api's `POST /v1/completions` and directly through Triton's
gRPC ensemble, interleaved, then stops it; the next repeat starts with the other one. Every
request streams, sends the same 39-token prompt and is forced to exactly --tokens output tokens
(`min_tokens` and `ignore_eos`), and every count is checked. Beside each batch: the CPU the
rest of the machine used meanwhile. Writes docs/benchmark-vllm-cpu.md and its plot. Usage:

    scripts/benchmark vllm-cpu [--tokens 128] [--concurrency 1 4 8 16] [--repeats 3] [--no-vllm]

`--model` (a family's name or a checkpoint folder: vllm_models.py) serves that checkpoint on
both servers instead, measures TritonBox through its api only and puts the rows into the table
of docs/benchmark-vllm-families.md (vllm_families.py); a model vLLM refuses gets its error there.

`--workload closed|open-loop|both` (or `--quick`) runs vLLM in each of its configurations and
the open-loop mixed workload instead, with options of its own: vllm_sweep.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from scripts.benchmarks.emulation import KINDS, apply
from scripts.benchmarks.load import One, Sample, grpc_path, sse
from scripts.benchmarks.proc import (
    OthersLoad,
    process_group_of,
    process_tree,
    rss_bytes,
)
from scripts.benchmarks.sampling_cost import sampled_over_greedy
from scripts.benchmarks.servers import start_stack
from scripts.benchmarks.vllm_env import install, kv_cache_bytes, start_vllm
from scripts.benchmarks.vllm_families import page as families_page
from scripts.benchmarks.vllm_families import record
from scripts.benchmarks.vllm_models import prompt_tokens, resolve
from scripts.benchmarks.vllm_report import Batch, Server, report
from tritonbox_testing.ports import free_ports

from tritonbox_common.client import TritonLLMClient
from tritonbox_triton.settings import TritonSettings

REPO = Path(__file__).resolve().parents[2]
# 39 tokens with SmolLM2's tokenizer (checked at start), as in the measurement that set the goal.
PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a wooden press. Explain in a few "
    "short paragraphs why it mattered so"
)
PROMPT_TOKENS = 39
SAMPLING = {"temperature": 0.0, "seed": 1}


def engine_process(group: list[int]) -> list[int]:
    """The Python-backend stub that runs the cpu engine, among tritonserver's processes."""
    return [
        pid for pid in group
        if b"/tensorrt_llm/1/model.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]  # fmt: skip


def openai_path(
    http: httpx.AsyncClient, base: str, model: str, prompt_tokens: int = PROMPT_TOKENS
) -> One:
    """A streamed `POST /v1/completions` forced to n tokens, counted by its usage chunk."""

    async def one(tokens: int) -> Sample:
        body = {
            "model": model, "prompt": PROMPT, "max_tokens": tokens, "min_tokens": tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            **SAMPLING,
        }  # fmt: skip
        started = time.perf_counter()
        events = await sse(http, f"{base}/v1/completions", body)
        # A random-weight model's first token may decode to no text: then its first chunk.
        chunks = [(at, e) for at, e in events if e.get("choices")]
        first = next((at for at, e in chunks if e["choices"][0]["text"]), chunks[0][0])
        usage = events[-1][1]["usage"]
        if usage["prompt_tokens"] != prompt_tokens:
            raise RuntimeError(f"{base}: {usage['prompt_tokens']} prompt tokens")
        return first - started, int(usage["completion_tokens"])

    return one


async def run_batch(
    name: str, one: One, concurrency: int, requests: int, tokens: int, pids: list[int]
) -> Batch:
    gate = asyncio.Semaphore(concurrency)

    async def gated() -> tuple[float, int, float]:
        async with gate:
            started = time.perf_counter()
            ttft, count = await one(tokens)
            return ttft, count, time.perf_counter() - started

    others, started = OthersLoad(pids), time.perf_counter()
    samples = await asyncio.gather(*(gated() for _ in range(requests)))
    wall = time.perf_counter() - started
    if any(count != tokens for _, count, _ in samples):
        counts = [count for _, count, _ in samples]
        raise RuntimeError(f"{name}: expected {tokens} tokens each, got {counts}")
    return Batch(name, concurrency, wall, list(samples), others.cores(wall))


async def measure(
    paths: dict[str, One], args: argparse.Namespace, pids: Callable[[], list[int]], rep: int
) -> list[Batch]:
    batches = []
    for one in paths.values():  # warm-up: connections, caches, the first steps' allocations
        await run_batch("warm-up", one, max(args.concurrency), max(args.concurrency), 8, pids())
    for concurrency in args.concurrency:
        requests = max(args.min_requests, concurrency * args.waves)
        names = list(paths)
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            batch = await run_batch(name, paths[name], concurrency, requests, args.tokens, pids())
            batches.append(batch)
            print(batch.line(), file=sys.stderr, flush=True)
    return batches


def limits(args: argparse.Namespace) -> tuple[int, int]:
    """Both servers' most sequences at once and longest sequence (prompt and output): the
    concurrency's largest, and TritonBox's default MAX_INPUT_LEN + MAX_OUTPUT_LEN."""
    fields = TritonSettings.model_fields
    length = fields["max_input_len"].default + fields["max_output_len"].default
    return max(args.concurrency), int(length)


def serve_vllm(args: argparse.Namespace, executable: Path, folder: Path, rep: int) -> Server:
    with contextlib.ExitStack() as stack:
        sequences, length, _ = args.limits
        url, pid, ready_s = start_vllm(
            stack, executable, args.model_dir, folder, max_seqs=sequences, max_model_len=length
        )

        async def go() -> list[Batch]:
            async with httpx.AsyncClient(timeout=600, trust_env=False) as http:
                paths = {"vLLM CPU": openai_path(http, url, "model", args.prompt_tokens)}
                return await measure(paths, args, lambda: process_tree(pid), rep)

        batches = asyncio.run(go())
        everything = process_tree(pid)
        memory = {"all its processes": (rss_bytes(everything), rss_bytes(everything, "VmHWM:"))}
        return Server("vLLM CPU", ready_s, memory, batches)


def kernel_build(up_log: Path) -> str:
    """How the engine came by its C library, from its ready line in tritonserver's log."""
    server_log = Path(re.findall(r"\(log: (.+?)\)", up_log.read_text())[-1])
    ready = next(line for line in server_log.read_text().splitlines() if "cpu engine ready" in line)
    built = re.search(r"compiled in ([\d.]+) s \(cold\)", ready)
    return f"the engine's C library compiled cold in {built[1]} s" if built else "its cache warm"


def serve_tritonbox(args: argparse.Namespace, folder: Path, rep: int) -> Server:
    """The stack through `scripts/up`, as a user starts it; the first turn with the engine's C
    library removed from the cache, to show its cold compile apart."""
    if rep == 0:
        for library in (REPO / ".cache" / "kernels").glob("fused_ops-*.so"):
            library.unlink()
    with contextlib.ExitStack() as stack:
        http_port, grpc_port, metrics_port, api_port = free_ports(4)
        sequences = args.limits[0]
        process, url, ready_s = start_stack(stack, folder, {
            "ENGINE": "cpu", "CACHE_DIR": str(REPO / ".cache"), "MAX_BATCH_SIZE": str(sequences),
            "MODEL_REPOSITORY": str(folder / "model_repository"),
            "TRITON_HTTP_PORT": str(http_port), "TRITON_GRPC_PORT": str(grpc_port),
            "TRITON_METRICS_PORT": str(metrics_port), "API_PORT": str(api_port),
            "DATABASE_PATH": str(folder / "predictions.db"), "MAX_CONCURRENT_REQUESTS": "256",
            **({} if args.model.default else {"ENGINE_REPOSITORY": str(args.model_dir)}),
        })  # fmt: skip
        marker = f"--grpc-port={grpc_port}".encode()

        async def go() -> list[Batch]:
            grpc = TritonLLMClient(f"127.0.0.1:{grpc_port}")
            async with httpx.AsyncClient(timeout=600, trust_env=False) as http:
                model = (await http.get(f"{url}/v1/models")).json()["data"][0]["id"]
                paths = {"TritonBox api": openai_path(http, url, model, args.prompt_tokens)}
                if args.model.default:
                    paths["TritonBox Triton"] = grpc_path(grpc, PROMPT, SAMPLING, exact_length=True)
                try:
                    return await measure(paths, args, lambda: process_tree(process.pid), rep)
                finally:
                    await grpc.close()

        batches = asyncio.run(go())
        engine, everything = engine_process(process_group_of(marker)), process_tree(process.pid)
        memory = {
            "the cpu engine's process": (rss_bytes(engine), rss_bytes(engine, "VmHWM:")),
            "the whole stack": (rss_bytes(everything), rss_bytes(everything, "VmHWM:")),
        }
        return Server("TritonBox", ready_s, memory, batches, kernel_build(folder / "up.log"))


def last_error(log: Path, error: Exception) -> str:
    """The line vLLM's log ends its traceback with (`SomeError: why`), else the error's."""
    text = log.read_text(errors="replace") if log.exists() else str(error)
    found = re.findall(r"^\S*(?:Error|Exception)\b.*$", text, flags=re.MULTILINE)
    return (found[-1] if found else text.strip().splitlines()[-1])[:400]


def main() -> int:
    if {arg.split("=")[0] for arg in sys.argv[1:]} & {"--workload", "--quick"}:
        from scripts.benchmarks.vllm_sweep import main as sweep  # it imports this module

        return sweep()
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    # A batch's first wave is a burst (its requests sent at once), not yet the closed loop that
    # a concurrency names, and the cpu engine waits a quiet gap for the rest of a burst. With two
    # waves a batch, half of the 8- and 16-stream samples and a quarter of the 4-stream ones were
    # first waves (docs/cpu-engine-history.md, "At the same limits", run 6).
    parser.add_argument("--waves", type=int, default=4, help="requests per batch: concurrency ×")
    # A median TTFT of one stream over 8 requests (4 a turn) moved by ±3 ms from run to run,
    # as much as the paths differ by there.
    parser.add_argument("--min-requests", type=int, default=32, help="requests per batch at least")
    parser.add_argument("--repeats", type=int, default=3, help="turns of each server")
    parser.add_argument("--no-vllm", action="store_true", help="TritonBox only")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmark-vllm-cpu.md")
    parser.add_argument("--model", help="a family's name or a checkpoint folder (vllm_models.py)")
    parser.add_argument(
        "--emulate", choices=sorted(KINDS), help="both as on an older CPU (emulation.py; --model)"
    )
    args = parser.parse_args()
    if args.emulate and not args.model:
        parser.error("--emulate goes with --model (the families page marks emulated rows)")
    args.emulated = apply(args.emulate) if args.emulate else None
    # The default model is prepared here on a fresh checkout (once; the engine uses it too).
    args.model = resolve(args.model)
    args.model_dir = args.model.folder
    args.prompt_tokens = prompt_tokens(args.model, PROMPT)
    if args.model.default and args.prompt_tokens != PROMPT_TOKENS:
        raise SystemExit(f"the prompt is {args.prompt_tokens} tokens, not {PROMPT_TOKENS}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop what was started
    sequences, length = limits(args)
    args.limits = (sequences, length, kv_cache_bytes(args.model_dir, sequences, length))
    executable = None if args.no_vllm else install()
    servers: list[Server] = []
    refused = None
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        for rep in range(args.repeats):
            turns = ["vllm", "tritonbox"] if rep % 2 == 0 else ["tritonbox", "vllm"]
            for turn in turns:
                folder = Path(tmp) / f"{turn}-{rep}"
                folder.mkdir()
                if turn == "tritonbox":
                    servers.append(serve_tritonbox(args, folder, rep))
                elif executable is not None and refused is None:
                    try:
                        servers.append(serve_vllm(args, executable, folder, rep))
                    except RuntimeError as error:  # recorded for a family vLLM does not serve
                        if args.model.default:
                            raise
                        refused = last_error(folder / "vllm.log", error)
    if not args.model.default:
        data = REPO / "docs" / "benchmark-vllm-families.json"
        record(args.model, servers, args, refused, data)
        page = data.with_suffix(".md")
        page.write_text(families_page(data))
        print(page.read_text())
        return 0
    note = None if args.no_vllm or executable else "vllm-cpu could not be installed here"
    sampling = sampled_over_greedy(args.model_dir, PROMPT, args.tokens, args.repeats)
    print(f"sampled / greedy, batch of 8: {sampling[0]:.3f}", file=sys.stderr)
    args.output.write_text(report(servers, args, time.monotonic() - started, note, sampling))
    print(args.output.read_text())
    return 0
