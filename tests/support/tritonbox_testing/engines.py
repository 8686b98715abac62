"""Stand-in TensorRT-LLM engine folders: a real config.json layout, empty rank files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_engine(
    path: Path,
    *,
    tp: int = 1,
    pp: int = 1,
    build: dict[str, Any] | None = None,
    plugins: dict[str, Any] | None = None,
) -> Path:
    """An engine folder in TensorRT-LLM's unified layout (0.10+), Gemma-7B-it INT4 AWQ style."""
    path.mkdir(parents=True, exist_ok=True)
    build_config: dict[str, Any] = {
        "max_batch_size": 64,
        "max_input_len": 3000,
        "max_seq_len": 4000,
    }
    build_config |= build or {}
    build_config["plugin_config"] = {
        "gpt_attention_plugin": "auto",
        "gemm_plugin": "auto",
        "paged_kv_cache": True,
        "remove_input_padding": True,
        "context_fmha": True,
    } | (plugins or {})
    mapping = {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
    config = {
        "version": "0.20.0",
        "pretrained_config": {"architecture": "GemmaForCausalLM", "mapping": mapping},
        "build_config": build_config,
    }
    (path / "config.json").write_text(json.dumps(config))
    for rank in range(tp * pp):
        (path / f"rank{rank}.engine").write_bytes(b"")
    return path
