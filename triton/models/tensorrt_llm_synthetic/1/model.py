"""The synthetic flavour of `tensorrt_llm`: a stand-in ONLY for benchmarking the api proxy.

No model: a request gets exactly `request_output_len` ids cycling through a fixed English text
(real tokenizer), so postprocessing and the api detokenise real text, `synthetic_token_interval_s`
apart (0 = as fast as they can be sent); `end_id` and stop words never end it early. Tensors,
validation and responses are the cpu flavour's: one response per token when streaming, else one
with every id, the last flagged final; a `stop` request ends the running request with its id.
`async def execute`: the Python backend runs it on its asyncio loop without waiting (decoupled
models), so hundreds of streams are tasks on one thread, not a thread each.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonbox_common.errors import RequestError
from tritonbox_common.model_params import config_parameters, dir_parameter, int_parameter
from tritonbox_common.tokenization import load_tokenizer
from tritonbox_triton.engine.params import EngineLimits, prompt_ids, sampling_params
from tritonbox_triton.parent_watch import watch_parent

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# The leading space makes the cycle's seam read "... river. The quick ..." on BPE tokenizers.
TEXT = (
    " The quick brown fox jumps over the lazy dog, and the dog, unbothered, goes back to sleep"
    " in the warm afternoon sun while the fox trots off towards the river."
)
INPUTS = (
    "input_ids", "input_lengths", "request_output_len", "end_id", "pad_id", "beam_width",
    "temperature", "runtime_top_k", "runtime_top_p", "repetition_penalty", "min_tokens",
    "presence_penalty", "frequency_penalty", "seed", "streaming", "exclude_input_in_output", "stop",
)  # fmt: skip
CANCEL_CHECK_S = 0.05  # is_cancelled() is a round trip to the server: ask at most this often
EARLY_STOP_TTL_S = 60.0  # a `stop` may overtake its request on the way in (as in the cpu engine)


def _response(ids: list[int]) -> Any:
    tokens = np.asarray(ids, dtype=np.int32).reshape(1, 1, -1)
    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor("output_ids", tokens),
            pb_utils.Tensor("sequence_length", np.array([[len(ids)]], dtype=np.int32)),
            pb_utils.Tensor("cum_log_probs", np.zeros((1, 1), dtype=np.float32)),
            pb_utils.Tensor("output_log_probs", np.zeros((1, 1, len(ids)), dtype=np.float32)),
        ]
    )


def _error(message: str, *code: Any) -> Any:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, *code))


def _send(sender: Any, response: Any, final: bool) -> bool:
    try:
        sender.send(response, flags=FINAL if final else 0)
        return True
    except Exception as error:  # the client may be gone; the other streams carry on
        pb_utils.Logger.log_warn(f"could not send a response: {error}")
        return False


class _Collector:
    """Stands in for a response sender when the model is not decoupled: keeps the one response."""

    def __init__(self, request: Any) -> None:
        self.is_cancelled = request.is_cancelled
        self.response: Any = None

    def send(self, response: Any, flags: int = 0) -> None:
        self.response = response


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        watch_parent()  # this stub ends when tritonserver does, however it ends
        config = json.loads(args["model_config"])
        params = config_parameters(config)
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        tokenizer = load_tokenizer(dir_parameter(params, "tokenizer_dir"))
        self._text_ids = [int(i) for i in tokenizer.encode(TEXT, add_special_tokens=False)]
        self._end_id = int(tokenizer.eos_token_id or 0)  # validated, never acted on
        self._interval = float(params["synthetic_token_interval_s"])
        max_input, max_output = (int_parameter(params, f"max_{k}_len") for k in ("input", "output"))
        # No KV cache to run out of: any prompt and output within the limits fit.
        self._limits = EngineLimits(max_input, max_output, max_input + max_output)
        self._exclude_input = params["exclude_input_in_output"].lower() == "true"
        self._stops: dict[str, float] = {}  # request id -> when its `stop` arrived
        pb_utils.Logger.log_warn(f"SYNTHETIC engine, benchmarks only: {self._interval} s/token")

    async def execute(self, requests: list[Any]) -> list[Any] | None:
        if self._decoupled:
            # The backend does not wait for this coroutine: the next batch arrives meanwhile.
            await asyncio.gather(*(self._serve(r, r.get_response_sender()) for r in requests))
            return None
        senders = [_Collector(request) for request in requests]
        await asyncio.gather(*(self._serve(r, s) for r, s in zip(requests, senders, strict=True)))
        return [sender.response for sender in senders]

    async def _serve(self, request: Any, sender: Any) -> None:
        try:
            await self._generate(request, sender)
        except Exception as error:  # a broken request must not leave its client waiting
            _send(sender, _error(f"synthetic engine failed: {error}"), final=True)

    async def _generate(self, request: Any, sender: Any) -> None:
        found = {name: pb_utils.get_input_tensor_by_name(request, name) for name in INPUTS}
        tensors = {name: tensor.as_numpy() for name, tensor in found.items() if tensor is not None}
        request_id = request.request_id()
        if "stop" in tensors and bool(tensors["stop"].reshape(-1)[0]):
            now = time.monotonic()  # every task runs on this one loop: no lock needed
            self._stops = {k: t for k, t in self._stops.items() if now - t < EARLY_STOP_TTL_S}
            if request_id:
                self._stops[request_id] = now
            _send(sender, _response([]), final=True)
            return
        try:
            prompt = prompt_ids(tensors, self._limits)
            params = sampling_params(
                tensors, self._limits, prompt_len=len(prompt), default_end_id=self._end_id,
                default_pad_id=self._end_id, exclude_input_default=self._exclude_input,
            )  # fmt: skip
        except (RequestError, ValueError) as error:
            _send(sender, _error(str(error)), final=True)
            return
        streaming = params.streaming and self._decoupled
        ids = [] if params.exclude_input_in_output else list(prompt)
        loop = asyncio.get_running_loop()
        start = checked = loop.time()
        tokens = itertools.islice(itertools.cycle(self._text_ids), params.max_tokens)
        for index, token in enumerate(tokens):
            # Paced by deadline: slow sends do not stretch it; sleep(0) lets other streams run.
            await asyncio.sleep(max(0.0, start + index * self._interval - loop.time()))
            cancelled = bool(request_id) and self._stops.pop(request_id, None) is not None
            if not cancelled and loop.time() - checked >= CANCEL_CHECK_S:
                checked, cancelled = loop.time(), bool(sender.is_cancelled())
            if cancelled:  # as the cpu engine answers a cancelled request
                _send(sender, _error("request cancelled", pb_utils.TritonError.CANCELLED), True)
                return
            if not streaming:
                ids.append(token)
            elif not _send(sender, _response([token]), final=index == params.max_tokens - 1):
                return  # the client is gone
        if not streaming:
            _send(sender, _response(ids), final=True)
