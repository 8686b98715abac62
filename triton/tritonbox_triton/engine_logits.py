"""What a TensorRT-LLM engine's build allows of its context logits, for the rendered config.

`trtllm-build --gather_context_logits` (0.20) writes `build_config.gather_context_logits`; without
it the executor refuses `return_context_logits` ("Return context logit need to build engine with
gather_context_logits"). The output `context_logits` has the engine's logits dtype
(`pretrained_config.logits_dtype`): NVIDIA's template leaves it to `fill_template.py`
(`${logits_datatype}`), and the backend writes FP32 or FP16 only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LOGITS_DATA_TYPE = {"float32": "TYPE_FP32", "float16": "TYPE_FP16"}


def _section(config: dict[str, Any], key: str) -> dict[str, Any]:
    section = config.get(key)
    return section if isinstance(section, dict) else {}


def logits_values(engine_dir: Path) -> dict[str, str]:
    """`logits_data_type` and `gather_context_logits` for the GPU flavour's templates."""
    config = json.loads((engine_dir / "config.json").read_text())
    dtype = _section(config, "pretrained_config").get("logits_dtype", "float32")
    gather = _section(config, "build_config").get("gather_context_logits") is True
    return {
        # An unknown dtype falls back to FP32 (the checkpoint default); the backend would refuse
        # any other at its first context-logits response.
        "logits_data_type": LOGITS_DATA_TYPE.get(str(dtype), "TYPE_FP32"),
        "gather_context_logits": "true" if gather else "false",
    }
