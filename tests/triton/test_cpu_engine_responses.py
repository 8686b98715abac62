"""How the cpu engine's model hands responses to Triton's response sender
(tritonbox_triton/cpu_model/responses.py), run against a stand-in for
`triton_python_backend_utils` whose sender does what the 24.10 stub's does inside `send`: it lets
go of the GIL and drops the outputs the request did not ask for. The stub then frees a dropped
tensor's numpy arrays without the GIL (python_backend #390), which corrupted the engine process's
memory under load; so a response carries only what was asked for, and every tensor outlives the
`send` call. (The served engine is exercised under tests/triton/server.)"""

from __future__ import annotations

import importlib.util
import sys
import types
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tritonbox_triton import cpu_model
from tritonbox_triton.engine.params import SamplingParams
from tritonbox_triton.engine.scheduler import EngineFinish

ALL_OUTPUTS = {"output_ids", "sequence_length", "cum_log_probs", "output_log_probs"}


class Tensor:
    def __init__(self, name: str, array: npt.NDArray[Any]) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: Any = None) -> None:
        self.output_tensors = list(output_tensors or [])
        self.error = error


class PruningSender:
    """Keeps what the client asked for and drops the rest, as the stub's `send` does; records
    whether a dropped tensor was freed before `send` returned."""

    def __init__(self, asked: set[str]) -> None:
        self.asked = asked
        self.sent: list[tuple[set[str], int]] = []
        self.freed_inside_send: list[str] = []

    def send(self, response: InferenceResponse, flags: int = 0) -> None:
        dropped = [t for t in response.output_tensors if t.name() not in self.asked]
        watched = [(t.name(), weakref.ref(t)) for t in dropped]
        response.output_tensors = [t for t in response.output_tensors if t.name() in self.asked]
        del dropped
        self.freed_inside_send += [name for name, alive in watched if alive() is None]
        self.sent.append(({t.name() for t in response.output_tensors}, flags))

    def is_cancelled(self) -> bool:
        return False


@pytest.fixture
def model_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    fake = types.ModuleType("triton_python_backend_utils")
    fake.Tensor = Tensor  # type: ignore[attr-defined]
    fake.InferenceResponse = InferenceResponse  # type: ignore[attr-defined]
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    # Loaded afresh under a name of its own, so that it binds this stand-in (the stub's module
    # exists only inside Triton's Python backend).
    path = Path(cpu_model.__file__).parent / "responses.py"
    spec = importlib.util.spec_from_file_location("_tritonbox_test_cpu_responses", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stream(module: Any, sender: PruningSender, wanted: frozenset[str]) -> None:
    params = SamplingParams(max_tokens=2, end_id=0, pad_id=0, streaming=True)
    with ThreadPoolExecutor(max_workers=1) as later:
        sink = module.TritonSink(sender, params, [5, 6], later, wanted)
        sink.on_tokens([7], [-0.5], None)
        sink.on_tokens([8], [-0.25], EngineFinish.LENGTH)


@pytest.mark.parametrize(
    "asked", [{"output_ids", "sequence_length"}, {"output_ids", "output_log_probs"}, ALL_OUTPUTS]
)
def test_a_streamed_response_carries_only_the_outputs_asked_for(
    model_module: Any, asked: set[str]
) -> None:
    sender = PruningSender(asked)
    _stream(model_module, sender, frozenset(asked))
    assert sender.sent == [(asked, 0), (asked, 1)]
    assert sender.freed_inside_send == []


def test_a_tensor_the_sender_drops_is_freed_after_send_returns(model_module: Any) -> None:
    # No names known (a request that named none gets every output): the stub may still drop
    # some, and those must outlive the call, so that they are freed under the GIL.
    sender = PruningSender({"output_ids", "sequence_length"})
    _stream(model_module, sender, frozenset())
    assert [names for names, _ in sender.sent] == [{"output_ids", "sequence_length"}] * 2
    assert sender.freed_inside_send == []


def test_the_stop_reply_carries_only_the_outputs_asked_for(model_module: Any) -> None:
    sender = PruningSender({"output_ids"})
    tensors = model_module.output_tensors(frozenset({"output_ids"}), [], [])
    model_module.send_outputs(sender, tensors, 1)
    assert sender.sent == [({"output_ids"}, 1)]
    assert [t.name() for t in tensors] == ["output_ids"]
    assert np.asarray(tensors[0]._array).shape == (1, 1, 0)
