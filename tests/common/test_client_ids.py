"""The client reads a response's ids from its raw bytes exactly as tritonclient's InferResult
conversion would, and asks only for what a caller without text needs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import InferResult, service_pb2

from tritonbox_common.client import (
    ENSEMBLE_IDS_OUTPUTS,
    IDS_OUTPUTS,
    GenerationRequest,
    _chunk,
    requested_outputs,
)

Tensor = tuple[str, str, np.ndarray[Any, Any]]


def _response(*tensors: Tensor) -> Any:
    response = service_pb2.ModelInferResponse(model_name="tensorrt_llm", id="r")
    for name, datatype, array in tensors:
        output = response.outputs.add(name=name, datatype=datatype)
        output.shape.extend(array.shape)
        response.raw_output_contents.append(array.tobytes())
    # As received: parsed from the wire, not the object built here.
    return service_pb2.ModelInferResponse.FromString(response.SerializeToString())


def _reference(response: Any) -> list[int]:
    """What the client returned before: tritonclient's arrays, the first `sequence_length`."""
    result = InferResult(response)
    ids = result.as_numpy("output_ids")
    length = int(np.asarray(result.as_numpy("sequence_length")).reshape(-1)[0])
    return [int(t) for t in ids.reshape(-1)[:length]]


def _ids(values: list[list[int]], dtype: Any = np.int32) -> Tensor:
    name = "INT32" if dtype == np.int32 else "INT64"
    return "output_ids", name, np.array([values], dtype=dtype)


def _length(*lengths: int, dtype: Any = np.int32) -> Tensor:
    name = "INT32" if dtype == np.int32 else "INT64"
    return "sequence_length", name, np.array([list(lengths)], dtype=dtype)


LOG_PROBS: Tensor = ("cum_log_probs", "FP32", np.zeros((1, 1), dtype=np.float32))

CASES = {
    "one token": (_ids([[1234]]), _length(1)),
    "several tokens": (_ids([[5, 6, 7]]), _length(3)),
    "fewer valid than sent": (_ids([[5, 6, 7, 0]]), _length(2)),
    "large and negative ids": (_ids([[2**31 - 1, -5]]), _length(2)),
    "every output, other order": (LOG_PROBS, _length(2), _ids([[8, 9]])),
    "two beams": (_ids([[1, 2], [3, 4]]), _length(2, 1)),
    "INT64 tensors": (_ids([[10, 11]], np.int64), _length(2, dtype=np.int64)),
}


@pytest.mark.parametrize("tensors", CASES.values(), ids=CASES.keys())
def test_ids_are_tritonclients(tensors: tuple[Tensor, ...]) -> None:
    response = _response(*tensors)
    chunk = _chunk(response, final=False)
    assert chunk.ids == _reference(response)
    assert all(type(token) is int for token in chunk.ids)


def test_the_empty_final_response_has_no_ids() -> None:
    chunk = _chunk(_response(), final=True)
    assert chunk.ids == [] and chunk.final and chunk.text == ""


def test_text_is_read_when_asked_for() -> None:
    text: Tensor = ("text_output", "BYTES", np.array([b"fox"], dtype=np.object_))
    # BYTES tensors travel length-prefixed: build it as tritonclient would serialise it.
    raw = len(b"fox").to_bytes(4, "little") + b"fox"
    response = _response(_ids([[1]]), _length(1))
    response.outputs.add(name=text[0], datatype=text[1]).shape.extend([1])
    response.raw_output_contents.append(raw)
    assert _chunk(response, final=False).text == "fox"


def test_requested_outputs() -> None:
    ensemble = GenerationRequest(prompt="hi", max_tokens=4)
    engine = GenerationRequest(prompt="hi", max_tokens=4, model="tensorrt_llm", input_ids=[1, 2])
    assert requested_outputs(ensemble, with_text=True) == []  # every output
    assert requested_outputs(engine, with_text=True) == []
    names = [o.name() for o in requested_outputs(engine, with_text=False)]
    assert names == list(IDS_OUTPUTS)
    # The ensemble keeps a postprocessing output, or Triton prunes the whole pipeline.
    names = [o.name() for o in requested_outputs(ensemble, with_text=False)]
    assert names == list(ENSEMBLE_IDS_OUTPUTS)
