"""The api's one connection to Triton: lifecycle, bounded health checks and the engine's facts.

One gRPC channel serves the whole process (streams are multiplexed on it). Every call that is not
a generation has a deadline, so a hung or restarting Triton can never hang a health probe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path

import grpc
import tritonclient.grpc.aio as grpcclient

from tritonbox_common.client import Chunk, GenerationRequest, TritonLLMClient, TritonRequestError
from tritonbox_common.ensemble import ENGINE_MODEL, READY_MODELS
from tritonbox_common.guided import GUIDE_TYPE_INPUT
from tritonbox_common.model_params import config_parameters, int_parameter, text_parameter

log = logging.getLogger(__name__)


# A full queue refuses a request for now only (MAX_QUEUE_SIZE): TensorRT-LLM's executor and the
# cpu engine say the first, Triton's own queue in front of the trtllm and synthetic engine steps
# (dynamic_batching's default_queue_policy, which a burst fills too) the second.
ENGINE_QUEUE_FULL = ("Maximum queue size of", "Exceeds maximum queue size")


def queue_full(error: str) -> bool:
    """The engine refused the request because a queue is full: a 429 to retry shortly."""
    return any(text in error for text in ENGINE_QUEUE_FULL)


class TritonUnavailableError(RuntimeError):
    """Triton cannot be reached or is not ready: the request may succeed if retried later."""


@dataclass(frozen=True)
class EngineInfo:
    """What the api must know about the serving engine, read from the preprocessing config."""

    tokenizer_dir: Path
    max_input_len: int
    max_output_len: int
    # The engine returns top log-probs (the cpu engine's `num_top_logprobs` input); TensorRT-LLM
    # 0.20 returns only the sampled token's.
    top_logprobs: bool = False
    # The engine follows guides (structured output): the cpu engine always; TensorRT-LLM when
    # its config turns xgrammar on (the engine folder had the tokenizer info; render.py).
    guided_decoding: bool = False
    # The cpu engine's compact prompt log-probs (`return_prompt_log_probs`); without it the api
    # asks TensorRT-LLM's `return_context_logits` and scores the prompt itself.
    prompt_log_probs: bool = False
    # A TensorRT-LLM engine built with --gather_context_logits (its config's parameter).
    context_logits: bool = False


@dataclass(frozen=True)
class LoraSupport:
    """What adapters the engine takes, read from its `tensorrt_llm` model config."""

    max_rank: int  # 0: adapters off (MAX_LORA_RANK=0, or a GPU engine built without the plugin)
    target_modules: tuple[str, ...]  # HF names, e.g. ("q_proj", "v_proj")
    weights_datatype: str  # what `lora_weights` must be sent as: FP32 (cpu), FP16/BF16 (GPU)


class TritonGateway:
    def __init__(self, url: str, *, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._client: TritonLLMClient | None = None

    def start(self) -> None:
        """Open the channel (connects lazily: Triton need not be up yet)."""
        if self._client is None:
            self._client = TritonLLMClient(self.url)

    async def stop(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    @property
    def _raw(self) -> grpcclient.InferenceServerClient:
        return self.client.server

    @property
    def client(self) -> TritonLLMClient:
        if self._client is None:
            raise RuntimeError("TritonGateway.start() was not called")
        return self._client

    async def is_ready(self) -> bool:
        """Server ready and every model of the ensemble ready."""
        try:
            if not await self._raw.is_server_ready(client_timeout=self.timeout_s):
                return False
            for model in READY_MODELS:
                if not await self._raw.is_model_ready(model, client_timeout=self.timeout_s):
                    return False
        except Exception:
            return False
        return True

    async def engine_info(self) -> EngineInfo:
        """The tokenizer and limits the preprocessing step enforces (one source of truth)."""
        try:
            config = await self._raw.get_model_config(
                "preprocessing", as_json=True, client_timeout=self.timeout_s
            )
            engine = await self._raw.get_model_config(
                ENGINE_MODEL, as_json=True, client_timeout=self.timeout_s
            )
        except Exception as error:
            raise TritonUnavailableError(f"cannot read Triton's model config: {error}") from None
        params = config_parameters(config["config"])
        inputs = {tensor["name"] for tensor in engine["config"].get("input", [])}
        backend = config_parameters(engine["config"]).get("guided_decoding_backend", "xgrammar")
        return EngineInfo(
            tokenizer_dir=Path(text_parameter(params, "tokenizer_dir")),
            max_input_len=int_parameter(params, "max_input_len"),
            max_output_len=int_parameter(params, "max_output_len"),
            top_logprobs="num_top_logprobs" in inputs,
            guided_decoding=GUIDE_TYPE_INPUT in inputs and backend == "xgrammar",
            prompt_log_probs="return_prompt_log_probs" in inputs,
            context_logits=config_parameters(engine["config"]).get("gather_context_logits")
            == "true",
        )

    async def lora_support(self) -> LoraSupport:
        """The engine's LoRA limits (one source of truth: the settings rendered into Triton)."""
        try:
            config = await self._raw.get_model_config(
                ENGINE_MODEL, as_json=True, client_timeout=self.timeout_s
            )
        except Exception as error:
            raise TritonUnavailableError(f"cannot read Triton's model config: {error}") from None
        params = config_parameters(config["config"])
        inputs = config["config"].get("input", [])
        weights = next((i for i in inputs if i["name"] == "lora_weights"), None)
        if weights is None or "max_lora_rank" not in params:
            return LoraSupport(max_rank=0, target_modules=(), weights_datatype="FP32")
        return LoraSupport(
            max_rank=int_parameter(params, "max_lora_rank", minimum=0),
            target_modules=tuple(params.get("lora_target_modules", "").split()),
            weights_datatype=str(weights.get("data_type", "TYPE_FP32")).removeprefix("TYPE_"),
        )

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        """The engine's responses; TritonUnavailableError when Triton cannot be reached,
        TritonRequestError when it refuses or fails the request.

        Leaving early only cancels the gRPC call: the engine's request is stopped by `stop`,
        which the caller sends once its stream is over (see PredictionService).
        """
        try:
            # Ids only: the api decodes them itself (Triton's per-token text is not exact).
            async for chunk in self.client.stream(request, stop_on_exit=False, with_text=False):
                yield chunk
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise TritonUnavailableError(f"Triton is unavailable: {error.details()}") from None
            raise TritonRequestError(f"Triton failed the request: {error.details()}") from None

    async def stop_request(self, request_id: str, *, timeout_s: float) -> bool:
        """Stop the engine's work on `request_id`; False when it could not be sent in time."""
        try:
            # In the calling task (wait_for would start another): the stop leaves at its first
            # step, so stops started before a request's stream are sent before it.
            async with asyncio.timeout(timeout_s):
                await self.client.stop(request_id)
        except Exception as error:  # Triton gone or slow: nothing more can be done from here
            log.warning("could not stop engine request %s: %r", request_id, error)
            return False
        return True
