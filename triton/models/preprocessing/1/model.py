"""Ensemble step `preprocessing`: prompt text and stop/bad words to token ids.

Thin on purpose: the logic lives in `tritonbox_common.tokenization` and `.word_lists`, tested
without Triton. A bad request gets an error response of its own; the rest of the batch is served.
"""

from __future__ import annotations

from typing import Any

import numpy.typing as npt
import triton_python_backend_utils as pb_utils

from tritonbox_common.end_ids import default_token_ids
from tritonbox_common.model_params import config_parameters, dir_parameter, int_parameter
from tritonbox_common.tokenization import (
    PreprocessingLimits,
    RequestError,
    load_tokenizer,
    preprocess,
)
from tritonbox_triton.parent_watch import watch_parent

INPUTS = ("QUERY", "REQUEST_OUTPUT_LEN", "BAD_WORDS_DICT", "STOP_WORDS_DICT", "END_ID", "PAD_ID")


def _invalid_argument(message: str) -> Any:
    # INVALID_ARG makes HTTP clients see 400 and gRPC clients INVALID_ARGUMENT, not a 500.
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    if code is None:
        return pb_utils.TritonError(message)
    return pb_utils.TritonError(message, code)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        watch_parent()  # this stub ends when tritonserver does, however it ends
        params = config_parameters(args["model_config"])
        tokenizer_dir = dir_parameter(params, "tokenizer_dir")
        self.limits = PreprocessingLimits(
            max_input_len=int_parameter(params, "max_input_len"),
            max_output_len=int_parameter(params, "max_output_len"),
        )
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.defaults = default_token_ids(self.tokenizer, tokenizer_dir)
        pb_utils.Logger.log_info(
            f"preprocessing: tokenizer {tokenizer_dir}, {self.limits}, {self.defaults}"
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._respond(request) for request in requests]

    def _respond(self, request: Any) -> Any:
        inputs: dict[str, npt.NDArray[Any] | None] = {}
        for name in INPUTS:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            inputs[name] = None if tensor is None else tensor.as_numpy()
        try:
            outputs = preprocess(self.tokenizer, self.limits, self.defaults, inputs)
        except RequestError as error:
            return pb_utils.InferenceResponse(
                output_tensors=[], error=_invalid_argument(str(error))
            )
        except Exception as error:  # one broken request must not fail its whole batch
            pb_utils.Logger.log_error(f"preprocessing failed: {error!r}")
            return pb_utils.InferenceResponse(
                output_tensors=[], error=pb_utils.TritonError(f"preprocessing failed: {error}")
            )
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, array) for name, array in outputs.items()]
        )

    def finalize(self) -> None:
        pb_utils.Logger.log_info("preprocessing: unloaded")
