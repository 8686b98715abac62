"""The cpu flavour of the `tensorrt_llm` step: a Hugging Face checkpoint, in-flight batched.

This file is Triton glue only: it turns input tensors into `EngineRequest`s for the engine
in `tritonbox_triton.engine` and the engine's tokens back into responses shaped like NVIDIA's
tensorrtllm backend (`output_ids` [batch=1, beam=1, tokens], ...). Streaming responses carry only
the new tokens; every request ends with one response flagged final, so no client waits on an
empty final response that never comes.

Longer than 250 lines because it maps every NVIDIA `tensorrt_llm` input and output onto the engine
(the engine itself is tritonbox_triton.engine); Triton's Python backend loads one model.py per
model.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer

from tritonbox_common.word_lists import decode_word_list
from tritonbox_triton.engine.attention import load_model
from tritonbox_triton.engine.dtype import describe, engine_dtype
from tritonbox_triton.engine.grammar import GUIDE_INPUT, GUIDE_TYPE_INPUT, GuideCompiler
from tritonbox_triton.engine.lora_cache import LORA_INPUTS, LoraCache, LoraResolver
from tritonbox_triton.engine.lora_layers import LoraRows, attach_lora
from tritonbox_triton.engine.params import (
    EngineLimits,
    RequestError,
    SamplingParams,
    prompt_ids,
    sampling_params,
)
from tritonbox_triton.engine.prompt_logprobs import PromptScores
from tritonbox_triton.engine.scheduler import (
    EngineFinish,
    EngineRequest,
    InflightBatcher,
    TopLogprobs,
)
from tritonbox_triton.engine.stats import FAMILIES, IterationStats, nvidia_values
from tritonbox_triton.engine.words import text_decoder
from tritonbox_triton.parent_watch import watch_parent

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
OUTCOMES = ("stop", "length", "stop_word", "cancelled", "error")
OPTIONAL_INPUTS = (
    "input_lengths", "request_output_len", "end_id", "pad_id", "stop_words_list",
    "bad_words_list", "beam_width", "temperature", "runtime_top_k", "runtime_top_p",
    "repetition_penalty", "min_tokens", "presence_penalty", "frequency_penalty", "seed",
    "return_log_probs", "streaming", "exclude_input_in_output", "stop", "num_top_logprobs",
    GUIDE_TYPE_INPUT, GUIDE_INPUT,
    "return_context_logits", "return_prompt_log_probs",
)  # fmt: skip


def _output_tensors(
    wanted: frozenset[str],
    ids: list[int],
    logprobs: list[float],
    top: list[TopLogprobs] | None = None,
    count: int = 0,
    prompt: PromptScores | None = None,
) -> list[Any]:
    """One response's output tensors, only those the request asked for (`wanted`; empty: all).
    Triton's stub drops the others inside `send`, after it let go of the GIL: this build's
    tensor destructor then frees their numpy arrays without it (python_backend #390, fixed after
    the 24.10 stub PyTriton 0.7.0 ships), which corrupted the stub's memory under load."""
    tokens = np.asarray(ids, dtype=np.int32).reshape(1, 1, -1)
    arrays = {
        "output_ids": tokens,
        "sequence_length": np.array([[tokens.shape[-1]]], dtype=np.int32),
        "cum_log_probs": np.array([[float(np.sum(logprobs))]], dtype=np.float32),
        "output_log_probs": np.asarray(logprobs, dtype=np.float32).reshape(1, 1, -1),
    }
    if top is not None:  # asked for (num_top_logprobs = count > 0): [batch, beam, tokens, N]
        shape = (1, 1, -1, count)
        arrays["top_token_ids"] = np.asarray([i for i, _ in top], np.int32).reshape(shape)
        arrays["top_log_probs"] = np.asarray([p for _, p in top], np.float32).reshape(shape)
    if prompt is not None:  # the prompt's scores (engine/prompt_logprobs.py), first response only
        arrays |= prompt.tensors
    return [
        pb_utils.Tensor(name, array)
        for name, array in arrays.items()
        if not wanted or name in wanted
    ]


def _send_outputs(sender: Any, tensors: list[Any], flags: int) -> None:
    """Send a response of `tensors`, which this frame keeps alive until `send` has returned: a
    tensor the stub drops inside it (one the client did not ask for) then only loses a
    reference there, and is freed here, under the GIL (`_output_tensors` says why)."""
    sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=flags)


def _word_list(tensors: dict[str, np.ndarray], name: str) -> list[list[int]]:
    array = tensors.get(name)
    return [] if array is None else decode_word_list(array.reshape(2, -1))


class _CollectingSender:
    """Stands in for a response sender when the model is not decoupled: keeps the one response."""

    def __init__(self, request: Any) -> None:
        self._request = request
        self.response: Any = None
        self.done = threading.Event()

    def is_cancelled(self) -> bool:
        return bool(self._request.is_cancelled())

    def send(self, response: Any = None, flags: int = 0) -> None:
        if response is not None:
            self.response = response
        if flags & FINAL:
            self.done.set()


class TritonSink:
    """Sends one request's tokens back through Triton, streamed or as one final response."""

    def __init__(
        self,
        sender: Any,
        params: SamplingParams,
        prompt: list[int],
        later: ThreadPoolExecutor,
        wanted: frozenset[str] = frozenset(),
    ) -> None:
        self._sender = sender
        self._wanted = wanted  # the outputs the request asked for (`_output_tensors`)
        self._later = later  # the one sending thread (TritonPythonModel.initialize says why)
        self._params = params
        self._ids: list[int] = [] if params.exclude_input_in_output else list(prompt)
        self._logprobs: list[float] = []
        self._top: list[TopLogprobs] | None = [] if params.num_top_logprobs else None
        self._prompt: PromptScores | None = None  # sent with the next response, then dropped
        self._cancelled = False
        self._asking = False  # a question to tritonserver is queued on the sending thread

    def _queue(self, send: Callable[[], None]) -> None:
        """Run `send` (a response built and sent) on the sending thread."""

        def run() -> None:
            try:
                send()
            except Exception as error:  # the client may be gone; the engine must carry on
                pb_utils.Logger.log_warn(f"could not send a response: {error}")

        self._later.submit(run)

    def _send(self, outputs: Callable[[], list[Any]], final: bool) -> None:
        """Queue a response of `outputs()` (built on the sending thread too) for the client."""
        sender, flags = self._sender, FINAL if final else 0
        self._queue(lambda: _send_outputs(sender, outputs(), flags))

    def _send_error(self, error: Any) -> None:
        sender = self._sender
        self._queue(lambda: sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL))

    def is_cancelled(self) -> bool:
        """Whether the client has left, as last asked. Asking is a round trip to tritonserver, so
        it is asked on the sending thread and the answer read at the engine's next check (every
        CANCEL_CHECK_S, engine/scheduler.py): a client that leaves is seen within two checks."""
        if not self._asking:
            self._asking = True
            self._later.submit(self._ask)
        return self._cancelled

    def _ask(self) -> None:
        try:
            self._cancelled = bool(self._sender.is_cancelled())
        except Exception as error:  # asked again at the next check
            pb_utils.Logger.log_warn(f"could not ask whether the client left: {error}")
        finally:
            self._asking = False

    def on_tokens(
        self,
        tokens: list[int],
        logprobs: list[float],
        finish: EngineFinish | None,
        top: Sequence[TopLogprobs] = (),
    ) -> None:
        if self._params.streaming:
            new_top = None if self._top is None else list(top)
            count, prompt, self._prompt = self._params.num_top_logprobs, self._prompt, None
            wanted = self._wanted
            self._send(
                lambda: _output_tensors(wanted, tokens, logprobs, new_top, count, prompt),
                final=finish is not None,
            )
            return
        self._ids += tokens
        self._logprobs += logprobs
        if self._top is not None:
            self._top += top
        if finish is not None:
            top_count = self._params.num_top_logprobs
            ids, logprobs_all, top_all, prompt = self._ids, self._logprobs, self._top, self._prompt
            wanted = self._wanted
            self._send(
                lambda: _output_tensors(wanted, ids, logprobs_all, top_all, top_count, prompt),
                final=True,
            )

    def on_prompt(self, scores: PromptScores) -> None:
        self._prompt = scores

    def on_error(self, message: str) -> None:
        self._send_error(pb_utils.TritonError(message))

    def on_cancelled(self) -> None:
        self._send_error(pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED))


# The request counts are set as soon as they change (they tell that a stopped request has left);
# everything else at most this often, and once more when the engine falls idle. Each set is a
# round trip to the Triton process, which on a loaded CPU costs milliseconds: a dozen per
# iteration slowed every decode step, and with it every stop.
FULL_UPDATE_S = 0.5
IMMEDIATE = {("nv_trt_llm_request_metrics", "active"), ("nv_trt_llm_request_metrics", "waiting")}


class TritonMetrics:
    """Engine metrics on Triton's /metrics: TensorRT-LLM backend's gauge families (same names
    and labels), plus token and outcome counters."""

    def __init__(self, model: str, version: str) -> None:
        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        # Triton invalidates a Metric once its family is garbage-collected: keep the families.
        self._families = {
            name: pb_utils.MetricFamily(name=name, description=description, kind=gauge)
            for name, (description, _) in FAMILIES.items()
        }
        for name, description in (
            ("tritonbox_engine_generated_tokens_total", "Tokens generated"),
            ("tritonbox_engine_finished_requests_total", "Requests done, by outcome"),
        ):
            self._families[name] = pb_utils.MetricFamily(
                name=name, description=description, kind=counter
            )
        labels = {"model": model, "version": version}
        self._gauges = {
            key: self._families[key[0]].Metric(labels={**labels, FAMILIES[key[0]][1]: key[1]})
            for key in nvidia_values(IterationStats(0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
        }
        self._tokens = self._families["tritonbox_engine_generated_tokens_total"].Metric(labels={})
        finished = self._families["tritonbox_engine_finished_requests_total"]
        self._finished = {name: finished.Metric(labels={"outcome": name}) for name in OUTCOMES}
        self._pending_tokens = 0
        self._last: dict[tuple[str, str], float] = {}
        self._full_at = 0.0
        self._idle_written = False

    def on_iteration(self, stats: IterationStats) -> None:
        now = time.monotonic()
        idle = not (stats.active or stats.waiting)
        full = now - self._full_at >= FULL_UPDATE_S or (idle and not self._idle_written)
        if full:
            self._full_at, self._idle_written = now, idle
            if self._pending_tokens:
                self._tokens.increment(self._pending_tokens)
                self._pending_tokens = 0
        for key, value in nvidia_values(stats).items():
            # Only changes: an idle engine iterates 20 times a second for nothing.
            if (full or key in IMMEDIATE) and self._last.get(key) != value:
                self._gauges[key].set(value)
                self._last[key] = value

    def on_tokens(self, count: int) -> None:
        self._pending_tokens += count

    def on_finished(self, outcome: str) -> None:
        self._finished[outcome].increment(1)


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
        dtype = engine_dtype(dtype_setting)
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
        self._guides = GuideCompiler(self._tokenizer, int(model.config.vocab_size))
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
        tensors: dict[str, np.ndarray] = {}
        for name in ("input_ids", *OPTIONAL_INPUTS, *LORA_INPUTS):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                tensors[name] = tensor.as_numpy()
        if "stop" in tensors and bool(tensors["stop"].reshape(-1)[0]):
            # TensorRT-LLM's `stop`: end the running request that has this request's id.
            self._engine.stop_request(request.request_id())
            _send_outputs(sender, _output_tensors(wanted, [], []), FINAL)
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
            # Converting new weights happens here, on Triton's thread, not in the engine loop;
            # so does compiling a grammar.
            lora = self._lora.resolve(tensors)
            guide = self._guides.from_tensors(tensors)
        except (RequestError, ValueError) as error:
            sender.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))), flags=FINAL
            )
            return
        if guide is not None:
            params = dataclasses.replace(params, guide=guide)
        if not self._decoupled:
            params = dataclasses.replace(params, streaming=False)  # one response per request
        self._engine.submit(
            EngineRequest(
                prompt=prompt,
                params=params,
                sink=TritonSink(sender, params, prompt, self._responses, wanted),
                stop_words=stop_words,
                bad_words=bad_words,
                request_id=request.request_id(),
                lora=lora,
            )
        )

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self._decoupled:
            for request in requests:
                self._submit(request, request.get_response_sender())
            return None
        # Not decoupled: Triton wants the responses back from this call, one per request.
        senders = [_CollectingSender(request) for request in requests]
        for request, sender in zip(requests, senders, strict=True):
            self._submit(request, sender)
        for sender in senders:
            sender.done.wait()
        return [sender.response for sender in senders]

    def finalize(self) -> None:
        self._engine.stop()
        self._responses.shutdown(wait=True)  # what the engine's stop queued goes out first
