"""What one generation request is, and the Triton input tensors it becomes: the ensemble's
(text in) or the `tensorrt_llm` step's (token ids in, optionally a LoRA adapter's tensors)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.grpc import InferInput

from tritonbox_common.guided import GUIDE_INPUT, GUIDE_TYPE_INPUT

# Optional ensemble inputs: name -> Triton datatype, named as the ensemble names them
# (docs/architecture.md).
SCALAR_INPUTS: dict[str, str] = {
    "end_id": "INT32",
    "pad_id": "INT32",
    "top_k": "INT32",
    "top_p": "FP32",
    "temperature": "FP32",
    "length_penalty": "FP32",
    "repetition_penalty": "FP32",
    "min_tokens": "INT32",
    "presence_penalty": "FP32",
    "frequency_penalty": "FP32",
    "seed": "UINT64",
    "return_log_probs": "BOOL",
    "num_top_logprobs": "INT32",  # the cpu engine's extension (docs/api.md); not the ensemble's
    "return_context_logits": "BOOL",  # TensorRT-LLM's: every prompt position's logits
    "return_prompt_log_probs": "BOOL",  # the cpu engine's compact extension of the above
    "beam_width": "INT32",
    "exclude_input_in_output": "BOOL",
}
_NUMPY_TYPES = {"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_}


@dataclass(frozen=True)
class LoraInputs:
    """A LoRA adapter for one request, as TensorRT-LLM takes it: the task id alone once the
    engine has cached it, with its `lora_weights` [rows, cols] and `lora_config` [rows, 3] the
    first time (common/tritonbox_common/lora has the layout)."""

    task_id: int
    weights: Any = None  # np.ndarray, float32 (sent as `weights_datatype`)
    config: Any = None  # np.ndarray, int32
    weights_datatype: str = "FP32"  # the engine's: FP32 on cpu, FP16/BF16 on a GPU engine

    def id_only(self) -> LoraInputs:
        return LoraInputs(self.task_id, weights_datatype=self.weights_datatype)


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    max_tokens: int
    stream: bool = True
    stop_words: Sequence[str] = ()
    bad_words: Sequence[str] = ()
    sampling: dict[str, float | int | bool] = field(default_factory=dict)
    model: str = "ensemble"
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Set: the prompt's ids go to the `tensorrt_llm` step itself (`model`), not the ensemble;
    # stop and bad words then come as packed `[2, N]` token-id lists (`stop_words` and
    # `bad_words` are the ensemble's).
    input_ids: Sequence[int] | None = None
    stop_word_ids: Any = None
    bad_word_ids: Any = None
    lora: LoraInputs | None = None  # with `input_ids`: the adapter that answers
    # Structured output: (guide type, guide or None), TensorRT-LLM's guided-decoding inputs.
    guide: tuple[str, str | None] | None = None


def input_tensor(name: str, array: np.ndarray[Any, Any], datatype: str) -> InferInput:
    tensor = InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


# The `tensorrt_llm` step's names for the ensemble inputs it gets under another name.
ENGINE_INPUT_NAMES = {
    "top_k": "runtime_top_k", "top_p": "runtime_top_p", "length_penalty": "len_penalty",
}  # fmt: skip


def build_engine_inputs(request: GenerationRequest) -> list[InferInput]:
    """The `tensorrt_llm` step's input tensors for a request with `input_ids`."""
    assert request.input_ids is not None
    ids = np.asarray([list(request.input_ids)], dtype=np.int32)
    inputs = [
        input_tensor("input_ids", ids, "INT32"),
        input_tensor("input_lengths", np.array([[ids.shape[1]]], dtype=np.int32), "INT32"),
        input_tensor(
            "request_output_len", np.array([[request.max_tokens]], dtype=np.int32), "INT32"
        ),
        input_tensor("streaming", np.array([[request.stream]], dtype=np.bool_), "BOOL"),
    ]
    for name, packed in (
        ("stop_words_list", request.stop_word_ids),
        ("bad_words_list", request.bad_word_ids),
    ):
        if packed is not None:
            words = np.asarray(packed, dtype=np.int32)[np.newaxis]
            inputs.append(input_tensor(name, words, "INT32"))
    for name, value in {"exclude_input_in_output": True, **request.sampling}.items():
        if name not in SCALAR_INPUTS:
            raise ValueError(f"unknown sampling input {name!r}; known: {sorted(SCALAR_INPUTS)}")
        datatype = SCALAR_INPUTS[name]
        array = np.array([[value]], dtype=_NUMPY_TYPES[datatype])
        inputs.append(input_tensor(ENGINE_INPUT_NAMES.get(name, name), array, datatype))
    if request.lora is not None:
        inputs += _lora_inputs(request.lora)
    return inputs + _guide_inputs(request)


def _guide_inputs(request: GenerationRequest) -> list[InferInput]:
    """TensorRT-LLM's `guided_decoding_guide_type` / `guided_decoding_guide`: TYPE_STRING [1]
    (BYTES to the client), the same names on the ensemble and the engine step."""
    if request.guide is None:
        return []
    guide_type, guide = request.guide
    values = {GUIDE_TYPE_INPUT: guide_type, GUIDE_INPUT: guide}
    return [
        input_tensor(name, np.array([[value.encode()]], dtype=np.object_), "BYTES")
        for name, value in values.items()
        if value is not None
    ]


def _weights(array: Any, datatype: str) -> np.ndarray[Any, Any]:
    if datatype == "BF16":
        import ml_dtypes  # tritonclient's own dependency; it takes BF16 only in this type

        return np.asarray(array, dtype=np.float32).astype(ml_dtypes.bfloat16)
    return np.asarray(array, dtype={"FP32": np.float32, "FP16": np.float16}[datatype])


def _lora_inputs(lora: LoraInputs) -> list[InferInput]:
    # Every input carries the batch dimension of 1 (the step's max_batch_size > 0).
    inputs = [input_tensor("lora_task_id", np.array([[lora.task_id]], dtype=np.uint64), "UINT64")]
    if lora.weights is not None:
        weights = _weights(lora.weights, lora.weights_datatype)
        config = np.asarray(lora.config, dtype=np.int32)
        inputs.append(input_tensor("lora_weights", weights[np.newaxis], lora.weights_datatype))
        inputs.append(input_tensor("lora_config", config[np.newaxis], "INT32"))
    return inputs


def build_inputs(request: GenerationRequest) -> list[InferInput]:
    """The ensemble's input tensors for one request (batch dimension 1); the `tensorrt_llm`
    step's when the request carries its `input_ids`."""
    if request.input_ids is not None:
        return build_engine_inputs(request)
    inputs = [
        input_tensor(
            "text_input", np.array([[request.prompt.encode()]], dtype=np.object_), "BYTES"
        ),
        input_tensor("max_tokens", np.array([[request.max_tokens]], dtype=np.int32), "INT32"),
        input_tensor("stream", np.array([[request.stream]], dtype=np.bool_), "BOOL"),
    ]
    for name, words in (("stop_words", request.stop_words), ("bad_words", request.bad_words)):
        if words:
            array = np.array([[word.encode() for word in words]], dtype=np.object_)
            inputs.append(input_tensor(name, array, "BYTES"))
    for name, value in request.sampling.items():
        if name not in SCALAR_INPUTS:
            raise ValueError(f"unknown sampling input {name!r}; known: {sorted(SCALAR_INPUTS)}")
        datatype = SCALAR_INPUTS[name]
        inputs.append(
            input_tensor(name, np.array([[value]], dtype=_NUMPY_TYPES[datatype]), datatype)
        )
    return inputs + _guide_inputs(request)
