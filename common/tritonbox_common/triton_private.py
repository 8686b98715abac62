"""The one private API of a pinned library that the Triton client keeps: tritonclient's request
builder, `tritonclient.grpc._utils._get_inference_request` (tritonclient 2.73.0,
requirements/llm.txt).

Why: every stream asks Triton for its empty final response (`triton_enable_empty_final_response`),
without which a decoupled ensemble's last response carries no "final" mark and a client can wait
forever (client.py). tritonclient's public `stream_infer` refuses "triton_*" parameters, and the
tensors' protobuf is reachable only through `InferInput`'s private `_get_tensor()` and
`_get_content()`, which this helper calls. tests/common/test_triton_private.py checks its
signature and what it builds against the pin, and that the public path still refuses the
parameter: an upgrade that changes either fails there, naming the version.
"""

from __future__ import annotations

from collections.abc import Sequence

from tritonclient.grpc import InferInput, InferRequestedOutput, service_pb2
from tritonclient.grpc._utils import _get_inference_request

TRITONCLIENT_PIN = "2.73.0"  # requirements/llm.txt
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"


def inference_request(
    model: str,
    request_id: str,
    inputs: Sequence[InferInput],
    outputs: Sequence[InferRequestedOutput] | None = None,
) -> service_pb2.ModelInferRequest:
    """Triton's ModelInferRequest for `inputs`, asking for the empty final response."""
    message: service_pb2.ModelInferRequest = _get_inference_request(
        model_name=model, inputs=inputs, model_version="", request_id=request_id,
        outputs=outputs or None, sequence_id=0, sequence_start=False, sequence_end=False,
        priority=0, timeout=None, parameters=None,
    )  # fmt: skip
    message.parameters[EMPTY_FINAL_RESPONSE].bool_param = True
    return message
