"""An asyncio gRPC client for the ensemble: one streamed generation per call, cancellable.

Every request asks for Triton's empty final response, so the end of a stream is always seen
(without it, a decoupled ensemble's last response carries no "final" mark and a client can wait
forever). Leaving the `async for` early, or cancelling the task, cancels the gRPC call and also
sends TensorRT-LLM's `stop` for the request's id to the `tensorrt_llm` step: Triton 2.51 does
not pass a gRPC cancellation on to the steps of an ensemble, so the engine would otherwise keep
generating for nobody.
"""

from __future__ import annotations

import functools
import struct
import sys
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import InferInput, InferRequestedOutput, InferResult
from tritonclient.grpc._utils import _get_inference_request

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
    "beam_width": "INT32",
    "exclude_input_in_output": "BOOL",
}
_NUMPY_TYPES = {"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_}


class TritonRequestError(RuntimeError):
    """Triton answered this request with an error (bad input, engine failure, ...)."""


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


@dataclass(frozen=True)
class Chunk:
    """One response: the new token ids (all of them when not streaming) and their text."""

    ids: list[int]
    final: bool
    result: InferResult | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def text(self) -> str:
        # Decoded only when read: the api decodes the ids itself, and deserialising
        # `text_output` for every streamed token was a tenth of its CPU at 64 streams.
        tensor = self.result.as_numpy("text_output") if self.result is not None else None
        if tensor is None:
            return ""
        return b"".join(t for t in np.asarray(tensor).reshape(-1)).decode()


@dataclass
class Generation:
    ids: list[int] = field(default_factory=list)
    text: str = ""
    chunks: int = 0
    time_to_first_token_s: float | None = None
    total_time_s: float = 0.0


def _input(name: str, array: np.ndarray[Any, Any], datatype: str) -> InferInput:
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
        _input("input_ids", ids, "INT32"),
        _input("input_lengths", np.array([[ids.shape[1]]], dtype=np.int32), "INT32"),
        _input("request_output_len", np.array([[request.max_tokens]], dtype=np.int32), "INT32"),
        _input("streaming", np.array([[request.stream]], dtype=np.bool_), "BOOL"),
    ]
    for name, packed in (
        ("stop_words_list", request.stop_word_ids),
        ("bad_words_list", request.bad_word_ids),
    ):
        if packed is not None:
            words = np.asarray(packed, dtype=np.int32)[np.newaxis]
            inputs.append(_input(name, words, "INT32"))
    for name, value in {"exclude_input_in_output": True, **request.sampling}.items():
        if name not in SCALAR_INPUTS:
            raise ValueError(f"unknown sampling input {name!r}; known: {sorted(SCALAR_INPUTS)}")
        datatype = SCALAR_INPUTS[name]
        array = np.array([[value]], dtype=_NUMPY_TYPES[datatype])
        inputs.append(_input(ENGINE_INPUT_NAMES.get(name, name), array, datatype))
    if request.lora is not None:
        inputs += _lora_inputs(request.lora)
    return inputs


def _weights(array: Any, datatype: str) -> np.ndarray[Any, Any]:
    if datatype == "BF16":
        import ml_dtypes  # tritonclient's own dependency; it takes BF16 only in this type

        return np.asarray(array, dtype=np.float32).astype(ml_dtypes.bfloat16)
    return np.asarray(array, dtype={"FP32": np.float32, "FP16": np.float16}[datatype])


def _lora_inputs(lora: LoraInputs) -> list[InferInput]:
    # Every input carries the batch dimension of 1 (the step's max_batch_size > 0).
    inputs = [_input("lora_task_id", np.array([[lora.task_id]], dtype=np.uint64), "UINT64")]
    if lora.weights is not None:
        weights = _weights(lora.weights, lora.weights_datatype)
        config = np.asarray(lora.config, dtype=np.int32)
        inputs.append(_input("lora_weights", weights[np.newaxis], lora.weights_datatype))
        inputs.append(_input("lora_config", config[np.newaxis], "INT32"))
    return inputs


def build_inputs(request: GenerationRequest) -> list[InferInput]:
    """The ensemble's input tensors for one request (batch dimension 1); the `tensorrt_llm`
    step's when the request carries its `input_ids`."""
    if request.input_ids is not None:
        return build_engine_inputs(request)
    inputs = [
        _input("text_input", np.array([[request.prompt.encode()]], dtype=np.object_), "BYTES"),
        _input("max_tokens", np.array([[request.max_tokens]], dtype=np.int32), "INT32"),
        _input("stream", np.array([[request.stream]], dtype=np.bool_), "BOOL"),
    ]
    for name, words in (("stop_words", request.stop_words), ("bad_words", request.bad_words)):
        if words:
            array = np.array([[word.encode() for word in words]], dtype=np.object_)
            inputs.append(_input(name, array, "BYTES"))
    for name, value in request.sampling.items():
        if name not in SCALAR_INPUTS:
            raise ValueError(f"unknown sampling input {name!r}; known: {sorted(SCALAR_INPUTS)}")
        datatype = SCALAR_INPUTS[name]
        inputs.append(_input(name, np.array([[value]], dtype=_NUMPY_TYPES[datatype]), datatype))
    return inputs


# What a stream asks for when its caller needs the ids only (`with_text=False`): the engine
# step's two id tensors, not its log-probs. The ensemble must still be asked for `text_output`:
# without one of postprocessing's outputs Triton prunes the whole pipeline (its config says why).
IDS_OUTPUTS = ("output_ids", "sequence_length")
ENSEMBLE_IDS_OUTPUTS = ("text_output", *IDS_OUTPUTS)
_INT32 = np.dtype("<i4")
_NATIVE_INT32 = sys.byteorder == "little" and struct.calcsize("i") == 4


def requested_outputs(request: GenerationRequest, with_text: bool) -> list[InferRequestedOutput]:
    """The outputs a stream asks Triton for; none named (every output) with text."""
    if with_text:
        return []
    names = IDS_OUTPUTS if request.input_ids is not None else ENSEMBLE_IDS_OUTPUTS
    return [InferRequestedOutput(name) for name in names]


def _ids(response: Any) -> list[int] | None:
    """The new ids of one `ModelInferResponse`, read from its raw bytes; None without ids.

    tritonclient's `InferResult.as_numpy` for `output_ids` and `sequence_length` cost about
    15 µs a token on the api's event loop (a search of the outputs and a typed array per call);
    reading the two INT32 tensors straight from the response costs a fifth of that.
    """
    ids_at = length_at = -1
    for index, output in enumerate(response.outputs):
        name = output.name
        if name == "output_ids" or name == "sequence_length":
            if output.datatype != "INT32":  # another engine's types: tritonclient's conversion
                return _typed_ids(InferResult(response))
            if name == "output_ids":
                ids_at = index
            else:
                length_at = index
    raw = response.raw_output_contents
    if ids_at < 0 or length_at < 0 or max(ids_at, length_at) >= len(raw):
        return None  # the empty final response
    # The first beam's first `sequence_length` ids (Triton's raw tensors are little-endian).
    length = int.from_bytes(raw[length_at][:4], "little", signed=True)
    if _NATIVE_INT32:  # a memoryview: a third of numpy's cost for a token or two
        ids: list[int] = memoryview(raw[ids_at]).cast("i")[:length].tolist()
    else:
        ids = np.frombuffer(raw[ids_at], dtype=_INT32)[:length].tolist()
    return ids


def _typed_ids(result: InferResult) -> list[int] | None:
    ids = result.as_numpy("output_ids")
    if ids is None:
        return None
    length = int(np.asarray(result.as_numpy("sequence_length")).reshape(-1)[0])
    return [int(t) for t in ids.reshape(-1)[:length]]


def _chunk(response: Any, final: bool) -> Chunk:
    ids = _ids(response)
    if ids is None:  # the empty final response
        return Chunk(ids=[], final=final)
    return Chunk(ids=ids, final=final, result=InferResult(response))


class TritonLLMClient:
    """Streams generations from the ensemble over one gRPC channel."""

    def __init__(self, url: str) -> None:
        self._client = grpcclient.InferenceServerClient(url=url)

    @property
    def server(self) -> grpcclient.InferenceServerClient:
        """tritonclient's own client, for health and metadata calls (one connection for all)."""
        return self._client

    async def close(self) -> None:
        await self._client.close()

    async def is_ready(self, model: str = "ensemble") -> bool:
        try:
            return bool(await self._client.is_server_ready()) and bool(
                await self._client.is_model_ready(model)
            )
        except Exception:
            return False

    def _open(
        self,
        model: str,
        request_id: str,
        inputs: list[InferInput],
        outputs: list[InferRequestedOutput] | None = None,
    ) -> Any:
        message = _get_inference_request(
            model_name=model, inputs=inputs, model_version="", request_id=request_id,
            outputs=outputs or None, sequence_id=0, sequence_start=False, sequence_end=False,
            priority=0, timeout=None, parameters=None,
        )  # fmt: skip
        # The public stream_infer() refuses "triton_*" parameters, and this one is what makes
        # the end of a decoupled stream visible; tritonclient is pinned, so the helper is stable.
        message.parameters["triton_enable_empty_final_response"].bool_param = True

        async def messages() -> AsyncIterator[object]:
            yield message

        return self._client._client_stub.ModelStreamInfer(messages())

    async def stream(
        self, request: GenerationRequest, *, stop_on_exit: bool = True, with_text: bool = True
    ) -> AsyncGenerator[Chunk, None]:
        """Yield each response as it arrives; the last one has `final=True`.

        With `stop_on_exit=False` a stream left early is only cancelled: the caller sends the
        engine's `stop` itself (the api does, from a task that no cancellation can interrupt).
        With `with_text=False` only the ids are asked for: a chunk's `text` is then empty when
        the request goes to the engine step (`input_ids`), which has no text output.
        """
        outputs = requested_outputs(request, with_text)
        call = self._open(request.model, request.request_id, build_inputs(request), outputs)
        finished = not stop_on_exit
        try:
            async for response in call:
                if response.error_message:
                    finished = True
                    raise TritonRequestError(response.error_message)
                final = response.infer_response.parameters["triton_final_response"].bool_param
                finished = final
                yield _chunk(response.infer_response, final)
                if final:
                    return
        finally:
            call.cancel()
            if not finished:
                await self.stop(request.request_id)

    async def stop(self, request_id: str) -> None:
        """Stop the engine's work on `request_id` (TensorRT-LLM's `stop` input)."""
        inputs = [
            _input("input_ids", np.zeros((1, 1), dtype=np.int32), "INT32"),
            _input("input_lengths", np.ones((1, 1), dtype=np.int32), "INT32"),
            _input("request_output_len", np.ones((1, 1), dtype=np.int32), "INT32"),
            _input("stop", np.ones((1, 1), dtype=np.bool_), "BOOL"),
        ]
        call = self._open("tensorrt_llm", request_id, inputs)
        try:
            async for response in call:
                if response.infer_response.parameters["triton_final_response"].bool_param:
                    break
        finally:
            call.cancel()

    async def generate(self, request: GenerationRequest) -> Generation:
        """Run one request to its end, collecting ids, text and timings."""
        result = Generation()
        started = time.perf_counter()
        async for chunk in self.stream(request):
            if chunk.ids and result.time_to_first_token_s is None:
                result.time_to_first_token_s = time.perf_counter() - started
            result.ids += chunk.ids
            result.text += chunk.text
            result.chunks += 1
        result.total_time_s = time.perf_counter() - started
        return result
