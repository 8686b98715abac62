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
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import InferInput, InferRequestedOutput, InferResult, service_pb2

from tritonbox_common.request_tensors import (
    GenerationRequest,
    LoraInputs,
    build_inputs,
    input_tensor,
)
from tritonbox_common.triton_private import inference_request

__all__ = ["Chunk", "Generation", "GenerationRequest", "LoraInputs", "TritonLLMClient",
           "TritonRequestError", "build_inputs"]  # fmt: skip


class TritonRequestError(RuntimeError):
    """Triton answered this request with an error (bad input, engine failure, ...)."""


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


# Triton's streaming method, called here as unary-stream (TritonLLMClient.__init__ says why).
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
# What a stream asks for when its caller needs the ids only (`with_text=False`): the engine
# step's two id tensors, not its log-probs. The ensemble must still be asked for `text_output`:
# without one of postprocessing's outputs Triton prunes the whole pipeline (its config says why).
IDS_OUTPUTS = ("output_ids", "sequence_length")
ENSEMBLE_IDS_OUTPUTS = ("text_output", *IDS_OUTPUTS)
_INT32 = np.dtype("<i4")
_NATIVE_INT32 = sys.byteorder == "little" and struct.calcsize("i") == 4


def requested_outputs(request: GenerationRequest, with_text: bool) -> list[InferRequestedOutput]:
    """The outputs a stream asks Triton for; none named (every output) with text. Log-probs
    only when the request asks the engine for them."""
    if with_text:
        return []
    names = IDS_OUTPUTS if request.input_ids is not None else ENSEMBLE_IDS_OUTPUTS
    if request.sampling.get("return_log_probs"):
        names = (*names, "output_log_probs")
    if request.sampling.get("num_top_logprobs"):
        names = (*names, "top_token_ids", "top_log_probs")
    if request.sampling.get("return_prompt_log_probs"):
        names = (*names, "prompt_log_probs")
        if request.sampling.get("num_top_logprobs"):
            names = (*names, "prompt_top_token_ids", "prompt_top_log_probs")
    if request.sampling.get("return_context_logits"):
        names = (*names, "context_logits")
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


def _channel_args() -> list[tuple[str, int]]:
    """tritonclient's own channel options, and at most a second between connection attempts:
    gRPC's wait grows after each failed one (to 2 minutes), and an api started beside a loading
    Triton reached it ~5 s after it was ready."""
    keepalive = grpcclient.KeepAliveOptions()
    return [
        *(("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
          ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE)),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", 250), ("grpc.max_reconnect_backoff_ms", 1000),
    ]  # fmt: skip


class TritonLLMClient:
    """Streams generations from the ensemble over one gRPC channel."""

    def __init__(self, url: str) -> None:
        self._client = grpcclient.InferenceServerClient(url=url, channel_args=_channel_args())
        # The streams' own channel, made with gRPC's public API (tritonclient's is private);
        # with the same target and options it shares tritonclient's connection (gRPC pools a
        # process's subchannels). Triton's ModelStreamInfer is a bidirectional stream, but
        # every call here sends one request and then closes its side, so it is called as
        # unary-stream: the request, its metadata and the close leave together, one turn of
        # the event loop after the call is made. As a bidirectional stream they took three
        # (start the call; its metadata sent; the write), each behind whatever else the loop
        # had to do, which under a burst of requests through the api is the other requests'
        # routes. Measured at 4 streams through the api: from the call to the engine's queue
        # 4.96 → 2.71 ms (median), 20.7 → 7.2 ms (90th percentile).
        self._channel = grpc.aio.insecure_channel(url, options=_channel_args())
        self._stream_infer = self._channel.unary_stream(
            STREAM_INFER,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )

    @property
    def server(self) -> grpcclient.InferenceServerClient:
        """tritonclient's own client, for health and metadata calls (one connection for all)."""
        return self._client

    async def close(self) -> None:
        await self._channel.close()
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
        # Built by tritonclient's private helper, kept apart in triton_private.py (why there).
        return self._stream_infer(inference_request(model, request_id, inputs, outputs))

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
            input_tensor("input_ids", np.zeros((1, 1), dtype=np.int32), "INT32"),
            input_tensor("input_lengths", np.ones((1, 1), dtype=np.int32), "INT32"),
            input_tensor("request_output_len", np.ones((1, 1), dtype=np.int32), "INT32"),
            input_tensor("stop", np.ones((1, 1), dtype=np.bool_), "BOOL"),
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
