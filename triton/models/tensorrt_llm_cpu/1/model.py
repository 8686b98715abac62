"""The cpu flavour of the `tensorrt_llm` step: a Hugging Face checkpoint, in-flight batched.

This file is Triton glue only: it reads the model's config, loads the model, and turns input
tensors into `EngineRequest`s for the engine in `tritonbox_triton.engine`; the engine's tokens go
back as responses shaped like NVIDIA's tensorrtllm backend's (`tritonbox_triton.cpu_model`,
where Triton's Python backend stub, which ignores PYTHONPATH, finds the rest of this model).
"""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer

from tritonbox_common.errors import RequestError
from tritonbox_common.word_lists import decode_word_list
from tritonbox_triton.cpu_model.metrics import TritonMetrics
from tritonbox_triton.cpu_model.responses import (
    FINAL,
    CollectingSender,
    TritonSink,
    output_tensors,
    send_outputs,
)
from tritonbox_triton.engine import prompt_logprobs
from tritonbox_triton.engine.attention import load_model
from tritonbox_triton.engine.dtype import describe, engine_dtype
from tritonbox_triton.engine.grammar import GUIDE_INPUT, GUIDE_TYPE_INPUT, Guide, GuideCompiler
from tritonbox_triton.engine.guide_pool import GuidePool
from tritonbox_triton.engine.lora_cache import LORA_INPUTS, LoraCache, LoraResolver
from tritonbox_triton.engine.lora_layers import LoraRows, attach_lora
from tritonbox_triton.engine.params import EngineLimits, prompt_ids, sampling_params
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.words import text_decoder
from tritonbox_triton.parent_watch import watch_parent

OPTIONAL_INPUTS = (
    "input_lengths", "request_output_len", "end_id", "pad_id", "stop_words_list",
    "bad_words_list", "beam_width", "temperature", "runtime_top_k", "runtime_top_p",
    "repetition_penalty", "min_tokens", "presence_penalty", "frequency_penalty", "seed",
    "return_log_probs", "streaming", "exclude_input_in_output", "stop", "num_top_logprobs",
    GUIDE_TYPE_INPUT, GUIDE_INPUT,
    "return_context_logits", "return_prompt_log_probs",
)  # fmt: skip


def _word_list(tensors: dict[str, np.ndarray[Any, Any]], name: str) -> list[list[int]]:
    array = tensors.get(name)
    return [] if array is None else decode_word_list(array.reshape(2, -1))


def _refuse(sender: Any, message: str) -> None:
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        watch_parent()  # this stub ends when tritonserver does, however it ends
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config["parameters"].items()}
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        # The engine's thread computes with them; this one (Triton's) computes alone, so that
        # OpenMP keeps no second team of workers (InflightBatcher.start says why).
        threads = int(params["cpu_threads"]) or torch.get_num_threads()
        torch.set_num_threads(1)
        model_dir = params["model_dir"]
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir)
        dtype_setting = params.get("cpu_dtype", "auto")
        dtype = engine_dtype(dtype_setting, kernel_dir=Path(params["kernel_dir"]))
        # The engine's attention, compiled beside the fused ops where it checks out: attention.py
        model = load_model(model_dir, dtype, Path(params["kernel_dir"]))
        max_input_len, max_output_len = int(params["max_input_len"]), int(params["max_output_len"])
        max_batch_size = int(params["max_batch_size"])
        # 0 = no cap of its own: room for a full batch of the longest requests.
        kv_tokens = int(params["max_tokens_in_paged_kv_cache"]) or max_batch_size * (
            max_input_len + max_output_len
        )
        self._limits = EngineLimits(max_input_len, max_output_len, kv_tokens)
        self._exclude_input = params["exclude_input_in_output"].lower() == "true"
        lora_rows = self._init_lora(model, params)
        # Structured output: the logits' width, which may exceed the tokenizer's vocabulary.
        self._vocab_size = int(model.config.vocab_size)
        self._guides = GuideCompiler(self._tokenizer, self._vocab_size)
        # Compiled off Triton's thread, within GUIDE_COMPILE_TIMEOUT_S (guide_pool.py).
        self._guide_pool = GuidePool(self._guides, float(params["guide_compile_timeout_s"]))
        self._end_id = int(self._tokenizer.eos_token_id)
        pad = self._tokenizer.pad_token_id
        self._pad_id = int(pad) if pad is not None else self._end_id
        self._engine = InflightBatcher(
            model,
            text_decoder(self._tokenizer),
            self._limits,
            max_batch_size=max_batch_size,
            max_queue_size=int(params.get("max_queue_size", "0")),
            observer=TritonMetrics(args["model_name"], args["model_version"]),
            lora_rows=lora_rows,
            threads=threads,
            kernel_dir=Path(params["kernel_dir"]),
        )
        # Responses leave from one thread of their own, in the order the engine made them.
        # Each send is a round trip to tritonserver through shared memory (about 0.5 ms on 2
        # busy cores; the backend lets go of the GIL meanwhile): at 16 requests, sent from the
        # engine's thread, they took a third of every decode step (docs/cpu-engine-history.md).
        self._responses = ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-sender")
        self._engine.start()
        pb_utils.Logger.log_info(
            f"cpu engine ready: {model_dir}, {describe(dtype_setting, dtype)}, "
            f"{threads} threads, decoupled={self._decoupled}, decoding with "
            f"{self._engine.describe()}"
        )

    def _init_lora(self, model: Any, params: dict[str, str]) -> LoraRows | None:
        """Wrap the model's projections for per-row adapters unless max_lora_rank is 0."""
        max_rank = int(params.get("max_lora_rank", "0"))
        cache = LoraCache(int(params.get("lora_cache_host_memory_bytes", str(1 << 30))))
        rows = None
        dims: dict[str, tuple[int, int]] = {}
        layers = 0
        if max_rank > 0:
            try:
                rows, dims, layers = attach_lora(model)
            except ValueError as error:  # not a Llama-shaped model: serve it without adapters
                pb_utils.Logger.log_warn(f"LoRA adapters disabled: {error}")
                max_rank = 0
        # With max_rank 0 a request that names an adapter is refused, never served as base.
        self._lora = LoraResolver(cache, dims, layers, max_rank)
        return rows

    def _submit(self, request: Any, sender: Any) -> None:
        wanted = frozenset(request.requested_output_names())
        tensors: dict[str, np.ndarray[Any, Any]] = {}
        for name in ("input_ids", *OPTIONAL_INPUTS, *LORA_INPUTS):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                tensors[name] = tensor.as_numpy()
        if "stop" in tensors and bool(tensors["stop"].reshape(-1)[0]):
            # TensorRT-LLM's `stop`: end the running request that has this request's id.
            self._engine.stop_request(request.request_id())
            send_outputs(sender, output_tensors(wanted, [], []), FINAL)
            return
        try:
            prompt = prompt_ids(tensors, self._limits)
            params = sampling_params(
                tensors,
                self._limits,
                prompt_len=len(prompt),
                default_end_id=self._end_id,
                default_pad_id=self._pad_id,
                exclude_input_default=self._exclude_input,
            )
            stop_words = _word_list(tensors, "stop_words_list")
            bad_words = _word_list(tensors, "bad_words_list")
            # Converting new weights happens here, on Triton's thread, not in the engine loop.
            lora = self._lora.resolve(tensors)
            guide_key = self._guides.requested(tensors)
            prompt_logprobs.check(params, len(prompt), self._vocab_size)
        except (RequestError, ValueError) as error:
            _refuse(sender, str(error))
            return
        if not self._decoupled:
            params = dataclasses.replace(params, streaming=False)  # one response per request
        request_id = request.request_id()  # read now: `start` may run after `execute` returned

        def start(guide: Guide | None) -> None:
            own = params if guide is None else dataclasses.replace(params, guide=guide)
            self._engine.submit(
                EngineRequest(
                    prompt=prompt,
                    params=own,
                    sink=TritonSink(sender, own, prompt, self._responses, wanted),
                    stop_words=stop_words,
                    bad_words=bad_words,
                    request_id=request_id,
                    lora=lora,
                )
            )

        # A guide not compiled yet is compiled by the pool's workers: this thread goes on
        # admitting requests, and `start` runs once it is compiled.
        self._guide_pool.request(guide_key, start, lambda message: _refuse(sender, message))

    def _admit(self, request: Any, sender: Any) -> None:
        """`_submit`, with an error that escapes it answered to this request alone: raised
        here, it would fail every request of Triton's batch."""
        try:
            self._submit(request, sender)
        except Exception as error:
            pb_utils.Logger.log_error(f"a request failed before the engine: {error!r}")
            _refuse(sender, f"the engine could not take the request: {error}")

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self._decoupled:
            for request in requests:
                self._admit(request, request.get_response_sender())
            return None
        # Not decoupled: Triton wants the responses back from this call, one per request.
        senders = [CollectingSender(request) for request in requests]
        for request, sender in zip(requests, senders, strict=True):
            self._admit(request, sender)
        for sender in senders:
            sender.done.wait()
        return [sender.response for sender in senders]

    def finalize(self) -> None:
        self._guide_pool.close()
        self._engine.stop()
        self._responses.shutdown(wait=True)  # what the engine's stop queued goes out first
