"""LoRA adapters through the real tritonserver: the ensemble passes TensorRT-LLM's three LoRA
tensors to the cpu engine, which serves them next to base requests and refuses bad ones alone."""

from __future__ import annotations

import queue
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from transformers import PreTrainedTokenizerBase
from tritonbox_testing.lora import lora_inputs, make_adapter, reference, reference_model

pytestmark = pytest.mark.server
MAX_TOKENS = 16
TYPES = {np.dtype(np.uint64): "UINT64", np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32"}


@pytest.fixture(scope="module")
def adapters(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        "qv": make_adapter(
            tokenizer_dir,
            tmp_path_factory.mktemp("qv"),
            7,
            r=8,
            lora_alpha=32,
            target_modules=["q_proj", "v_proj"],
        ),
        # Over the server's MAX_LORA_RANK (64 by default).
        "wide": make_adapter(
            tokenizer_dir, tmp_path_factory.mktemp("wide"), 8, r=128, target_modules=["q_proj"]
        ),
    }


def prompt_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[str, list[int]]:
    prompt = str(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    )
    return prompt, list(tokenizer(prompt).input_ids)


def send_all(url: str, requests: list[dict[str, np.ndarray[Any, Any]]]) -> list[list[int] | str]:
    """Send every request on one stream at once; each one's ids, or its error message."""
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(
        callback=partial(lambda q, result, error: q.put((result, error)), responses)
    )
    results: dict[str, list[int] | str] = {}
    try:
        for index, tensors in enumerate(requests):
            inputs = []
            for name, array in tensors.items():
                datatype = "BYTES" if array.dtype == np.object_ else TYPES[array.dtype]
                tensor = grpcclient.InferInput(name, list(array.shape), datatype)
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            client.async_stream_infer(
                "ensemble", inputs, request_id=str(index), enable_empty_final_response=True
            )
        ids: dict[str, list[int]] = {}
        while len(results) < len(requests):
            result, error = responses.get(timeout=180)
            if error is not None:
                # A stream error carries no request id: errors come after the results, in
                # arrival order, so a test puts its failing requests last.
                results[str(error)] = str(error)
                continue
            response = result.get_response()
            output = result.as_numpy("output_ids")
            if output is not None:
                ids.setdefault(response.id, []).extend(output.reshape(-1).tolist())
            if response.parameters["triton_final_response"].bool_param:
                results[response.id] = ids.get(response.id, [])
    finally:
        client.stop_stream()
        client.close()
    ordered: list[list[int] | str] = [
        results.pop(str(i)) for i in range(len(requests)) if str(i) in results
    ]
    return ordered + list(results.values())


def request(prompt: str, lora: dict[str, np.ndarray[Any, Any]] | None = None) -> dict[str, Any]:
    tensors = {
        "text_input": np.array([[prompt.encode()]], dtype=np.object_),
        "max_tokens": np.array([[MAX_TOKENS]], dtype=np.int32),
    }
    return tensors | (lora or {})


def test_adapter_base_and_a_bad_adapter_side_by_side(
    triton_server: Any, tokenizer_dir: Path, tokenizer: PreTrainedTokenizerBase, adapters: Any
) -> None:
    peft_model = reference_model(tokenizer_dir, {"qv": adapters["qv"]})
    url = triton_server.grpc_url
    prompt, ids = prompt_ids(tokenizer, "Name a fruit.")
    with_adapter = reference(peft_model, ids, "qv", MAX_TOKENS)
    base = reference(peft_model, ids, None, MAX_TOKENS)
    assert with_adapter != base

    first = send_all(
        url,
        [
            request(prompt, lora_inputs(adapters["qv"])),  # weights: converted and cached
            request(prompt),
            request(prompt, lora_inputs(adapters["wide"])),
        ],
    )
    assert first[:2] == [with_adapter, base]
    assert isinstance(first[2], str) and "Invalid low_rank (128)" in first[2]

    # The id alone now, from the engine's cache; an id never sent is TensorRT-LLM's cache miss.
    cached = request(prompt, lora_inputs(adapters["qv"], with_weights=False))
    unknown = request(prompt, {"lora_task_id": np.array([[12345]], dtype=np.uint64)})
    second = send_all(url, [cached, unknown])
    assert second[0] == with_adapter
    message = "LoRA task 12345 not found in cache. Please send LoRA weights with request"
    assert isinstance(second[1], str) and message in second[1]
