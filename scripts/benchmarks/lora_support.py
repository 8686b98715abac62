"""scripts/benchmarks/lora.py's pieces: the benchmark's adapters (made with peft), the LoRA input
tensors of one request (TensorRT-LLM 0.20's names, issue 19), one request on each path (gRPC to
the engine step, the api's chat completions) and the adapter load time from disk."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
from tritonclient.grpc import InferInput, InferResult

from tritonbox_common.client import (
    GenerationRequest,
    TritonLLMClient,
    TritonRequestError,
    build_inputs,
    requested_outputs,
)
from tritonbox_common.lora import PeftAdapter, read_peft_adapter, task_id, to_lora_tensors

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / ".cache" / "models" / "SmolLM2-135M-Instruct"

# Triton's config dtypes the LoRA weights may have (the cpu engine's is TYPE_FP32; NVIDIA's is
# the engine's fp16/bf16): the bench reads it from the `tensorrt_llm` config, as the api does.
CONFIG_DTYPES: dict[str, tuple[npt.DTypeLike, str]] = {
    "TYPE_FP32": (np.float32, "FP32"),
    "TYPE_FP16": (np.float16, "FP16"),
}
Sample = tuple[float, int]  # (TTFT in seconds, output tokens) of one request
BLOCK = 4  # decode steps in a row on one plan (base, or the adapters) in step_times


def make_adapters(
    folder: Path,
    count: int,
    rank: int,
    modules: Sequence[str],
    base_factory: Callable[[], Any],
    base_model_id: str | None = None,
) -> list[Path]:
    """`count` different PEFT adapters of `rank` on `modules`, saved under `folder`.

    `init_lora_weights=False` draws B at random as well as A (peft's default starts B at zero,
    an adapter that changes nothing), so every adapter really changes the model's output, as a
    trained one does; seed i makes adapter i.
    """
    import torch
    from peft import LoraConfig, get_peft_model

    paths = []
    for i in range(count):
        torch.manual_seed(i)
        config = LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            target_modules=list(modules),
            lora_dropout=0.0,
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base_factory(), config)
        if base_model_id is not None:
            model.peft_config["default"].base_model_name_or_path = base_model_id
        path = folder / f"adapter-{i}"
        model.save_pretrained(str(path), save_embedding_layers=False)
        paths.append(path)
    return paths


def _input(name: str, array: npt.NDArray[Any], datatype: str) -> InferInput:
    tensor = InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def lora_inputs(
    adapter: PeftAdapter, tensors: tuple[npt.NDArray[Any], npt.NDArray[Any]] | None, datatype: str
) -> list[InferInput]:
    """The `tensorrt_llm` step's LoRA inputs for one request: the task id, and the weights and
    config when `tensors` is given (the first use of an adapter; later requests send the id
    alone, as the api does). Batch dimension 1 on each."""
    inputs = [_input("lora_task_id", np.array([[task_id(adapter.sha256)]], np.uint64), "UINT64")]
    if tensors is not None:
        weights, config = tensors
        inputs.append(_input("lora_weights", weights[np.newaxis], datatype))
        inputs.append(_input("lora_config", config[np.newaxis].astype(np.int32), "INT32"))
    return inputs


def load_times(folder: Path, repeats: int, dtype: npt.DTypeLike) -> list[float]:
    """Seconds for read_peft_adapter + to_lora_tensors of the adapter in `folder`, `repeats`
    times (the files stay in the page cache after the first read: a warm disk)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        to_lora_tensors(read_peft_adapter(folder), dtype)
        times.append(time.perf_counter() - started)
    return times


async def direct(client: TritonLLMClient, ids: list[int], tokens: int, lora: list[Any]) -> Sample:
    """One request to the `tensorrt_llm` step, with the LoRA inputs `lora`; (TTFT, tokens)."""
    request = GenerationRequest(
        "", tokens, sampling={"min_tokens": tokens}, model="tensorrt_llm", input_ids=ids
    )
    outputs = requested_outputs(request, with_text=False)
    # TritonLLMClient has no LoRA inputs of its own (the api branch adds them): its stream
    # opener with the engine inputs plus ours.
    call = client._open(request.model, request.request_id, build_inputs(request) + lora, outputs)
    started, ttft, count = time.perf_counter(), 0.0, 0
    try:
        async for response in call:
            if response.error_message:
                raise TritonRequestError(response.error_message)
            result = response.infer_response
            lengths = InferResult(result).as_numpy("sequence_length")
            new = 0 if lengths is None else int(np.asarray(lengths).reshape(-1)[0])
            if new and not count:
                ttft = time.perf_counter() - started
            count += new
            if result.parameters["triton_final_response"].bool_param:
                break  # it may carry the last token: counted first
    finally:
        call.cancel()
    return ttft, count


async def via_api(http: httpx.AsyncClient, url: str, model: str, text: str, tokens: int) -> Sample:
    """One streamed chat completion through the api, `model` = the base or an adapter."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "stream_options": {"include_usage": True},
    }
    started, ttft, usage = time.perf_counter(), 0.0, 0
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(
                f"the api answered {response.status_code}: {await response.aread()!r}"
            )
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = httpx.Response(200, content=line[6:]).json()
            if "error" in event:
                raise RuntimeError(f"the api failed a request: {event}")
            if not ttft and event["choices"] and event["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - started
            usage = int((event.get("usage") or {}).get("completion_tokens", usage))
    return ttft, usage


def step_times(
    adapters: Sequence[PeftAdapter], prompt: list[int], rows: int, steps: int
) -> tuple[list[float], list[float]]:
    """The cpu engine's own LoRA layers (attach_lora) on the default model, in this process:
    seconds of one decode step of a `rows`-wide batch on the bare base and with row i on
    adapter i mod len(adapters), `steps` of each. They alternate in blocks of BLOCK steps, so
    both see the same noise; a block's first step, which switches the layers' plan (something
    a steady decode batch does not do every step), is not counted."""
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    from tritonbox_triton.engine.lora_layers import EngineAdapter, attach_lora

    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL, dtype=torch.float32).eval()
    lora_rows, _, _ = attach_lora(model)
    engine = [  # as the engine holds them: fp32 tensors, the scaling inside B
        EngineAdapter(
            task_id(a.sha256),
            {
                k: (torch.from_numpy(pa), torch.from_numpy(pb * a.scaling))
                for k, (pa, pb) in a.weights.items()
            },
            a.rank,
            a.size_bytes,
        )
        for a in adapters
    ]
    mixed = [engine[i % len(engine)] for i in range(rows)]
    ids = torch.tensor([prompt] * rows)
    base_s: list[float] = []
    mixed_s: list[float] = []
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        lora_rows.use([None] * rows)
        model(input_ids=ids, past_key_values=cache)
        position = len(prompt)
        while len(mixed_s) < steps:
            for plan, times in (([None] * rows, base_s), (mixed, mixed_s)):
                lora_rows.use(plan)
                for step in range(BLOCK + 1):
                    positions = torch.full((rows, 1), position)
                    started = time.perf_counter()
                    model(input_ids=ids[:, :1], position_ids=positions, past_key_values=cache)
                    if step:
                        times.append(time.perf_counter() - started)
                    position += 1
    return base_s[:steps], mixed_s[:steps]
