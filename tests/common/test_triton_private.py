"""tritonclient's private request builder, the one private API the Triton client keeps
(triton_private.py says why): if a tritonclient upgrade changes it, these fail and say so."""

from __future__ import annotations

import inspect
import re
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import InferInput, InferRequestedOutput, _utils
from tritonclient.utils import InferenceServerException

from tritonbox_common.triton_private import (
    EMPTY_FINAL_RESPONSE,
    TRITONCLIENT_PIN,
    inference_request,
)

REPO = Path(__file__).resolve().parents[2]
UPGRADED = (
    f"tritonclient {version('tritonclient')} is installed; triton_private.py was written for "
    f"{TRITONCLIENT_PIN} and calls its private tritonclient.grpc._utils._get_inference_request: "
    "re-read that helper (and whether stream_infer now takes triton_* parameters), then move "
    "the pin"
)


def test_tritonclient_is_the_pinned_version() -> None:
    pinned = re.search(
        r"^tritonclient\[grpc\]==(\S+)$", (REPO / "requirements/llm.txt").read_text(), re.M
    )
    assert pinned and pinned.group(1) == TRITONCLIENT_PIN, "requirements/llm.txt moved the pin"
    assert version("tritonclient") == TRITONCLIENT_PIN, UPGRADED


def test_the_helper_takes_what_it_is_given() -> None:
    expected = ["model_name", "inputs", "model_version", "request_id", "outputs", "sequence_id",
                "sequence_start", "sequence_end", "priority", "timeout", "parameters"]  # fmt: skip
    helper = getattr(_utils, "_get_inference_request", None)
    assert helper is not None, UPGRADED
    assert list(inspect.signature(helper).parameters) == expected, UPGRADED


def test_the_request_carries_the_tensors_and_asks_for_the_empty_final_response() -> None:
    ids = InferInput("input_ids", [1, 3], "INT32")
    ids.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.int32))
    text = InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"hi"]], dtype=np.object_))
    outputs = [InferRequestedOutput("output_ids")]
    message = inference_request("ensemble", "r-1", [ids, text], outputs)
    assert (message.model_name, message.model_version, message.id) == ("ensemble", "", "r-1")
    assert [(t.name, t.datatype, list(t.shape)) for t in message.inputs] == [
        ("input_ids", "INT32", [1, 3]), ("text_input", "BYTES", [1, 1])
    ], UPGRADED  # fmt: skip
    assert message.raw_input_contents[0] == np.array([1, 2, 3], dtype="<i4").tobytes(), UPGRADED
    assert message.raw_input_contents[1] == b"\x02\x00\x00\x00hi", UPGRADED
    assert [o.name for o in message.outputs] == ["output_ids"], UPGRADED
    assert dict(message.parameters).keys() == {EMPTY_FINAL_RESPONSE}, UPGRADED
    assert message.parameters[EMPTY_FINAL_RESPONSE].bool_param is True


def test_the_public_path_still_refuses_the_parameter() -> None:
    """Why the private helper is kept: stream_infer builds its requests with it, passing the
    caller's parameters, and it refuses "triton_*" ones. When it stops refusing, client.py can
    use the public stream_infer."""
    with pytest.raises(InferenceServerException, match="triton_"):
        _utils._get_inference_request(
            model_name="m", inputs=[], model_version="", request_id="", outputs=None,
            sequence_id=0, sequence_start=False, sequence_end=False, priority=0, timeout=None,
            parameters={EMPTY_FINAL_RESPONSE: True},
        )  # fmt: skip
