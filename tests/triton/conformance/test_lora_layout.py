"""`tritonbox_common.lora.to_lora_tensors` against NVIDIA's conversion of a PEFT adapter.

`nvidia_convert` below is NVIDIA's `convert_hf_model` of examples/hf_lora_convert.py
(TensorRT-LLM, SOURCE.md "LoRA" names the commit), ported from torch to numpy line by line for
a plain LoRA (no DoRA, no MoE, no fused gate_up_proj): HF module -> module id through
`hf_modules_to_trtllm_modules` and `LoraManager.LORA_MODULE_IDS`; per (layer, module) one row
of A [r, in] flattened then B [out, r] times alpha/r (alpha/sqrt(r) with rSLoRA) flattened,
cast to the storage dtype, zero-padded to the longest row. Rows come in any order (each names
its module and layer), so rows are compared by (module_id, layer_idx).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from tritonbox_common import lora

LORA = json.loads(Path(__file__).with_name("nvidia_tensorrt_llm_0_20.json").read_text())["lora"]
# (in, out) of a tiny Llama: hidden 32, 4 heads of 8, 2 KV heads, MLP 48.
DIMS = {
    "q_proj": (32, 32),
    "k_proj": (32, 16),
    "v_proj": (32, 16),
    "o_proj": (32, 32),
    "gate_proj": (32, 48),
    "up_proj": (32, 48),
    "down_proj": (48, 32),
}


def write_peft(
    folder: Path,
    modules: tuple[str, ...],
    *,
    rank: int,
    alpha: float,
    rslora: bool,
    layers: int = 2,
    seed: int = 0,
) -> Path:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "tiny-llama",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": list(modules),
        "use_rslora": rslora,
        "bias": "none",
        "fan_in_fan_out": False,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    tensors = {}
    for layer in range(layers):
        for module in modules:
            fan_in, fan_out = DIMS[module]
            part = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            key = f"base_model.model.model.layers.{layer}.{part}.{module}"
            tensors[f"{key}.lora_A.weight"] = rng.normal(size=(rank, fan_in)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = rng.normal(size=(fan_out, rank)).astype(np.float32)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def nvidia_convert(folder: Path, dtype: Any) -> dict[tuple[int, int], tuple[int, Any]]:
    """convert_hf_model, numpy: {(module_id, layer): (adapter_size, unpadded row)}."""
    from safetensors.numpy import load_file

    config = json.loads((folder / "adapter_config.json").read_text())
    alpha, use_rslora = config["lora_alpha"], config.get("use_rslora", False)
    rows: dict[tuple[int, int], tuple[int, Any]] = {}
    weights = load_file(str(folder / "adapter_model.safetensors"))
    for key, a in weights.items():
        if ".lora_A." not in key:
            continue
        b = weights[key.replace(".lora_A.", ".lora_B.")]
        layer, hf_module = int(key.split(".layers.")[1].split(".")[0]), key.split(".")[-3]
        adapter_size = min(a.shape)  # derive_adapter_size
        scale = alpha / np.sqrt(adapter_size) if use_rslora else alpha / adapter_size
        if a.shape[1] < a.shape[0]:  # in weights should be [adapter_size, hidden]
            a = a.T
        if b.shape[0] < b.shape[1]:  # out weights should be [hidden, adapter_size]
            b = b.T
        row = np.concatenate([a.flatten().astype(dtype), (b * scale).flatten().astype(dtype)])
        module_id = LORA["module_ids"][LORA["hf_to_trtllm"][hf_module]]
        rows[(module_id, layer)] = (adapter_size, row)
    return rows


def ours(folder: Path, dtype: Any) -> tuple[Any, Any]:
    weights, config = lora.to_lora_tensors(lora.read_peft_adapter(folder), np.dtype(dtype))
    # A request's tensors may carry the batch dimension of 1 ([1, rows, cols]).
    weights = weights[0] if weights.ndim == 3 else weights
    config = config[0] if config.ndim == 3 else config
    return weights, config


@pytest.mark.parametrize(
    ("modules", "rank", "alpha", "rslora"),
    [
        (("q_proj", "v_proj"), 4, 8.0, False),
        (tuple(DIMS), 8, 16.0, False),  # every projection: the gate/up mapping included
        (("k_proj", "o_proj", "down_proj"), 4, 8.0, True),  # rSLoRA: alpha / sqrt(r)
    ],
)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_rows_match_nvidias_conversion(
    tmp_path: Path, modules: tuple[str, ...], rank: int, alpha: float, rslora: bool, dtype: Any
) -> None:
    folder = write_peft(tmp_path / "adapter", modules, rank=rank, alpha=alpha, rslora=rslora)
    theirs = nvidia_convert(folder, dtype)
    weights, config = ours(folder, dtype)
    assert weights.dtype == np.dtype(dtype)
    assert config.dtype == np.int32 and config.shape == (len(theirs), len(LORA["config_columns"]))
    assert weights.shape[0] == config.shape[0]
    # NVIDIA pads every row to the longest; the runtime needs at least each row's own size.
    assert weights.shape[1] >= max(row.size for _, row in theirs.values())
    seen = set()
    for (module_id, layer, adapter_size), row in zip(config.tolist(), weights, strict=True):
        key = (module_id, layer)
        assert key in theirs, f"row {key} is not in NVIDIA's conversion"
        want_size, want = theirs[key]
        assert adapter_size == want_size, key
        np.testing.assert_allclose(row[: want.size], want, rtol=1e-3, atol=1e-6, err_msg=str(key))
        assert not row[want.size :].any(), f"{key}: padding is not zero"
        seen.add(key)
    assert seen == set(theirs)


@pytest.mark.parametrize(
    ("module", "module_id"),
    [("gate_proj", 5), ("up_proj", 7), ("down_proj", 6), ("o_proj", 4), ("q_proj", 1)],
)
def test_module_ids(tmp_path: Path, module: str, module_id: int) -> None:
    # loraModule.h ModuleType: kMLP_H_TO_4H = 5 (HF gate_proj), kMLP_GATE = 7 (HF up_proj).
    folder = write_peft(tmp_path / "a", (module,), rank=2, alpha=2.0, rslora=False, layers=1)
    _, config = ours(folder, np.float16)
    assert config.tolist() == [[module_id, 0, 2]]


def test_task_ids_fit_lora_task_id() -> None:
    # lora_task_id is TYPE_UINT64; the api's ids are 60-bit content hashes (the contract).
    task = lora.task_id("f" * 64)
    assert task == 2**60 - 1 and 0 < task < 2**63
