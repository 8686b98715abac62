"""Benchmark multi-LoRA serving on the cpu engine: a batch spread over 4 adapters vs the bare base.

In one run, against one tritonserver serving the default model on the cpu engine:
- 4 rank-16 adapters are made with peft at start (`init_lora_weights=False`: random A and B, so
  each really changes the output); each is sent once with its weights (the engine caches it),
  after which requests carry its task id alone, as the api does (issue 19);
- batches of N concurrent requests, each decoding exactly T tokens (min_tokens = max_tokens),
  all on the bare base or request i on adapter i mod 4, interleaved and repeated, a different
  one first each time: output tokens/s (tokens / wall time) and TTFT p50, with the cores other
  processes used meanwhile beside each batch;
- over gRPC straight to the `tensorrt_llm` step with the LoRA tensors (`lora_task_id`,
  `lora_weights`, `lora_config`), and with `--api`, also through the api (adapters registered
  with `POST /v1/adapters`, selected with `model`) when it has those routes;
- the engine's LoRA layers' decode step in-process, base and adapters alternating step by step
  (the same noise for both: this machine is shared);
- the adapter load time from disk (read_peft_adapter + to_lora_tensors), median of several.
Writes docs/benchmark-lora.md. Usage (from the repo root):

    scripts/benchmark lora [--requests 8] [--tokens 32] [--api]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from scripts.benchmarks.cpu_engine import QUESTIONS, prompts
from scripts.benchmarks.lora_report import BASE, MIXED, Batch, LoadTime, report
from scripts.benchmarks.lora_support import (
    CONFIG_DTYPES,
    direct,
    load_times,
    lora_inputs,
    make_adapters,
    step_times,
    via_api,
)
from scripts.benchmarks.proc import (
    cpu_seconds,
    machine_cpu_seconds,
    process_group_of,
    process_tree,
)
from scripts.benchmarks.servers import start_api, start_cpu_engine
from scripts.demo_adapter.train import BASE_MODEL_ID, DEFAULT_MODEL

from tritonbox_common.client import TritonLLMClient
from tritonbox_common.lora import LLAMA_MODULES, read_peft_adapter, to_lora_tensors

REPO = Path(__file__).resolve().parents[2]


async def batch(
    path: str, mix: str, repeat: int, runs: list[Any], pids: dict[str, list[int]], tokens: int
) -> Batch:
    """Run the coroutines `runs` at once; their samples, wall time and whose CPU it was
    (`pids`: "triton", tritonserver's process group; "api", the api's processes)."""
    before = {k: cpu_seconds(v) for k, v in pids.items()}
    client_before = sum(os.times()[:2])
    machine_before, started = machine_cpu_seconds(), time.perf_counter()
    samples = await asyncio.gather(*runs)
    wall = time.perf_counter() - started
    spent = {k: cpu_seconds(v) - before[k] for k, v in pids.items()}
    ours = sum(spent.values()) + sum(os.times()[:2]) - client_before
    others = max(0.0, machine_cpu_seconds() - machine_before - ours) / wall
    if any(count != tokens for _, count in samples):
        raise RuntimeError(f"expected {tokens} tokens per request, got {[c for _, c in samples]}")
    return Batch(path, mix, repeat, wall, list(samples), others, ours / wall, spent["triton"])


async def measure(
    args: argparse.Namespace, grpc_url: str, adapters: list[Path], api: dict[str, Any]
) -> list[Batch]:
    client = TritonLLMClient(grpc_url)
    config = await client.server.get_model_config("tensorrt_llm", as_json=True)
    kinds = {i["name"]: i["data_type"] for i in config["config"]["input"]}
    if "lora_task_id" not in kinds:
        raise SystemExit("the engine has no LoRA inputs (lora_task_id, lora_weights, lora_config)")
    dtype, datatype = CONFIG_DTYPES[kinds["lora_weights"]]
    loaded = [read_peft_adapter(path) for path in adapters]
    first = [lora_inputs(a, to_lora_tensors(a, dtype), datatype) for a in loaded]
    by_id = [lora_inputs(a, None, datatype) for a in loaded]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    texts = prompts(tokenizer, args.requests)
    ids = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.requests)]  # as `texts`
    http = httpx.AsyncClient(timeout=600, trust_env=False)
    # Warm-up: each adapter's weights once (the engine caches them), the base, the api's models.
    await asyncio.gather(*(direct(client, ids[0], 4, lora) for lora in [[], *first]))
    for name in api.get("models", []):
        await via_api(http, api["url"], name, questions[0], 4)

    def runs(path: str, mix: str) -> list[Any]:
        pick = [i % len(adapters) if mix == MIXED else None for i in range(args.requests)]
        if path == "Triton gRPC":
            return [
                direct(client, ids[i], args.tokens, [] if a is None else by_id[a])
                for i, a in enumerate(pick)
            ]
        models = api["models"]
        return [
            via_api(http, api["url"], models[0 if a is None else a + 1], questions[i], args.tokens)
            for i, a in enumerate(pick)
        ]

    paths = ["Triton gRPC", *(["api"] if api.get("models") else [])]
    batches: list[Batch] = []
    try:
        for repeat in range(args.repeats):
            for path in paths:
                for mix in (BASE, MIXED) if repeat % 2 == 0 else (MIXED, BASE):
                    pids = {"triton": process_group_of(api["triton_marker"])}
                    pids["api"] = api.get("pids", [])
                    batches.append(
                        await batch(path, mix, repeat, runs(path, mix), pids, args.tokens)
                    )
                    print(batches[-1].line(), file=sys.stderr, flush=True)
    finally:
        await http.aclose()
        await client.close()
    return batches


def register(
    stack: contextlib.ExitStack, folder: Path, grpc_url: str, adapters: list[Path]
) -> dict[str, Any]:
    """An api process with the adapters registered through `POST /v1/adapters`: its URL, pids
    and model names (the base first); empty when this api has no adapter routes yet."""
    # The adapters' folders are the api's allowed adapter roots (ADAPTER_DIRS).
    roots = ",".join(sorted({str(path.parent.resolve()) for path in adapters}))
    url, pid = start_api(stack, folder / "api", grpc_url, {"ADAPTER_DIRS": roots})
    base = httpx.get(f"{url}/v1/models", trust_env=False).json()["data"][0]["id"]
    names = []
    for i, path in enumerate(adapters):
        answer = httpx.post(
            f"{url}/v1/adapters",
            json={"name": f"bench-{i}", "source": str(path)},
            trust_env=False,
            timeout=60,
        )
        if answer.status_code in (404, 405):
            print("the api has no adapter routes: gRPC only", file=sys.stderr)
            return {}
        answer.raise_for_status()
        names.append(f"bench-{i}")
    return {"url": url, "pids": process_tree(pid), "models": [base, *names]}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=8, help="concurrent requests per batch")
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--repeats", type=int, default=3, help="batches per path and mix")
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--target-modules", nargs="+", default=LLAMA_MODULES)
    parser.add_argument("--load-repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20, help="in-process decode steps per mix")
    parser.add_argument("--step-threads", type=int, default=1, help="torch threads for them")
    parser.add_argument("--api", action="store_true", help="also through the api, if it can")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmark-lora.md")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop what was started
    load_before = os.getloadavg()[0]
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # only to make the adapters: the engine gets the cores

    def base() -> Any:
        return AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL, dtype=torch.float32)

    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        made = make_adapters(
            folder, args.adapters, args.rank, args.target_modules, base, BASE_MODEL_ID
        )
        attention = make_adapters(folder / "attention", 1, args.rank, LLAMA_MODULES[:4], base)[0]
        loads = [
            LoadTime(
                f"rank {args.rank}, {label}",
                (path / "adapter_model.safetensors").stat().st_size,
                load_times(path, args.load_repeats, np.float32),
            )
            for label, path in (
                (" ".join(args.target_modules), made[0]),
                ("q k v o_proj", attention),
            )
        ]
        from transformers import AutoTokenizer

        prompt = prompts(AutoTokenizer.from_pretrained(DEFAULT_MODEL), 1)[0]
        prompt_ids = AutoTokenizer.from_pretrained(DEFAULT_MODEL)(prompt).input_ids
        # One thread: on a busy machine two spin against each other and the step times
        # drown in it (575 vs 892 ms medians, 5x spreads, in a run with two).
        torch.set_num_threads(args.step_threads)
        loaded = [read_peft_adapter(path) for path in made]
        steps = step_times(loaded, prompt_ids, args.requests, args.steps)
        medians = [f"{sorted(v)[len(v) // 2] * 1000:.1f} ms" for v in steps]
        print(f"decode step, base / 4 adapters: {' / '.join(medians)}", file=sys.stderr)
        torch.set_num_threads(1)  # the engine gets the cores
        settings = start_cpu_engine(stack, folder, max(16, args.requests))
        api = {"triton_marker": f"--grpc-port={settings.triton_grpc_port}".encode()}
        if args.api:
            api |= register(stack, folder, settings.grpc_url, made)
        started = time.monotonic()
        batches = asyncio.run(measure(args, settings.grpc_url, made, api))
        elapsed = time.monotonic() - started
    command = " ".join(["scripts/benchmark lora", *sys.argv[1:]])
    setup = {
        "command": command,
        "elapsed": f"{elapsed / 60:.1f} min",
        "engine": f"`ENGINE=cpu`, the default model (SmolLM2-135M-Instruct, fp32), "
        f"`MAX_BATCH_SIZE={settings.max_batch_size}`, engine threads = all cores, "
        "`MAX_LORA_RANK` and `LORA_CACHE_HOST_MEMORY_BYTES` at their defaults.",
        "steps": f"{args.step_threads}",
        "workload": f"batches of {args.requests} requests sent at once (chat prompts of 30-40 "
        f"tokens), each decoding exactly {args.tokens} tokens (min_tokens = max_tokens); "
        f"{args.repeats} batches per path and mix, base and adapters alternating which goes "
        "first. Adapter requests send the task id alone: each adapter's weights were sent once "
        "during the warm-up, as the api does on an adapter's first use.",
        "adapters": f"{args.adapters} made at start with peft (rank {args.rank}, alpha "
        f"{2 * args.rank}, `init_lora_weights=False`: random A and B) on "
        f"{' '.join(args.target_modules)}; request i uses adapter i mod {args.adapters}.",
    }
    page = report(batches, loads, setup, (load_before, os.getloadavg()[0]), steps)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(page)
    print(page)
    return 0
