"""The cpu engine's responses as Triton's: tensors shaped like NVIDIA's tensorrtllm backend's
(`output_ids` [batch=1, beam=1, tokens], ...), streamed or as one final response, sent from the
model's one sending thread. Streaming responses carry only the new tokens; every request ends with
one response flagged final, so no client waits on an empty final response that never comes.

Imported by `triton/models/tensorrt_llm_cpu/1/model.py` inside Triton's Python backend stub,
which provides `triton_python_backend_utils` (and ignores PYTHONPATH: hence this package).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonbox_triton.engine.params import SamplingParams
from tritonbox_triton.engine.prompt_logprobs import PromptScores
from tritonbox_triton.engine.request import EngineFinish, TopLogprobs

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def output_tensors(
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


def send_outputs(sender: Any, tensors: list[Any], flags: int) -> None:
    """Send a response of `tensors`, which this frame keeps alive until `send` has returned: a
    tensor the stub drops inside it (one the client did not ask for) then only loses a
    reference there, and is freed here, under the GIL (`output_tensors` says why)."""
    sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=flags)


class CollectingSender:
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
        self._wanted = wanted  # the outputs the request asked for (`output_tensors`)
        self._later = later  # the one sending thread (the model's `initialize` says why)
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
        self._queue(lambda: send_outputs(sender, outputs(), flags))

    def _send_error(self, error: Any) -> None:
        sender = self._sender
        self._queue(lambda: sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL))

    def is_cancelled(self) -> bool:
        """Whether the client has left, as last asked. Asking is a round trip to tritonserver, so
        it is asked on the sending thread and the answer read at the engine's next check (every
        `cancel_check_s`, engine/timings.py): a client that leaves is seen within two checks."""
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
                lambda: output_tensors(wanted, tokens, logprobs, new_top, count, prompt),
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
                lambda: output_tensors(wanted, ids, logprobs_all, top_all, top_count, prompt),
                final=True,
            )

    def on_prompt(self, scores: PromptScores) -> None:
        self._prompt = scores

    def on_error(self, message: str) -> None:
        self._send_error(pb_utils.TritonError(message))

    def on_cancelled(self) -> None:
        self._send_error(pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED))
