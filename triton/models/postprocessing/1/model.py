"""Ensemble step `postprocessing`: each response's token ids to text (`text_output`).

Stateless, like NVIDIA's: every response is decoded on its own, so a streamed chunk can split a
multi-byte character or drop a SentencePiece space. That is why the ensemble also returns
`output_ids`: the api decodes exactly and incrementally from the ids, never from these chunks.
Log probabilities pass through when the engine returned them (only on `return_log_probs`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonbox_common.model_params import bool_parameter, config_parameters, dir_parameter
from tritonbox_common.tokenization import decode_outputs, load_tokenizer
from tritonbox_triton.parent_watch import watch_parent

PASSTHROUGH = (("CUM_LOG_PROBS", "OUT_CUM_LOG_PROBS"), ("OUTPUT_LOG_PROBS", "OUT_OUTPUT_LOG_PROBS"))
# NVIDIA's postprocessing passes the engine's context logits through too, in their own dtype
# (FP32 or FP16: the engine's logits dtype).
CONTEXT_LOGITS = ("CONTEXT_LOGITS", "OUT_CONTEXT_LOGITS")


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        watch_parent()  # this stub ends when tritonserver does, however it ends
        params = config_parameters(args["model_config"])
        tokenizer_dir = dir_parameter(params, "tokenizer_dir")
        self.skip_special_tokens = bool_parameter(params, "skip_special_tokens", True)
        self.tokenizer = load_tokenizer(tokenizer_dir)
        pb_utils.Logger.log_info(f"postprocessing: tokenizer {tokenizer_dir}")

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._respond(request) for request in requests]

    def _respond(self, request: Any) -> Any:
        try:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
            text = decode_outputs(
                self.tokenizer, tokens, lengths, skip_special_tokens=self.skip_special_tokens
            )
        except Exception as error:  # one broken response must not fail the whole batch
            pb_utils.Logger.log_error(f"postprocessing failed: {error!r}")
            return pb_utils.InferenceResponse(
                output_tensors=[], error=pb_utils.TritonError(f"postprocessing failed: {error}")
            )
        outputs = [pb_utils.Tensor("OUTPUT", text)]
        # Absent inputs stay absent: the ensemble then leaves those outputs out, as NVIDIA's does.
        for source, target in PASSTHROUGH:
            tensor = pb_utils.get_input_tensor_by_name(request, source)
            if tensor is not None:
                outputs.append(pb_utils.Tensor(target, np.asarray(tensor.as_numpy(), np.float32)))
        logits = pb_utils.get_input_tensor_by_name(request, CONTEXT_LOGITS[0])
        if logits is not None:
            outputs.append(pb_utils.Tensor(CONTEXT_LOGITS[1], logits.as_numpy()))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def finalize(self) -> None:
        pb_utils.Logger.log_info("postprocessing: unloaded")
