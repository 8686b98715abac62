"""The PEFT reader and TensorRT-LLM layout against adapters peft itself writes at test time."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from tritonbox_common.lora import (
    AdapterError,
    from_lora_tensors,
    llama_module_dims,
    read_peft_adapter,
    task_id,
    to_lora_tensors,
)

TINY: dict[str, Any] = {"hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 4}
TINY |= {"num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 32}
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DIMS = llama_module_dims(hidden=16, intermediate=24, heads=4, kv_heads=2, head_dim=4)


def make_adapter(folder: Path, dtype: torch.dtype = torch.float32, **lora: Any) -> Path:
    """A tiny Llama adapter with random (nonzero) A and B, saved the way peft saves it."""
    torch.manual_seed(0)
    options: dict[str, Any] = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    options |= {"init_lora_weights": False} | lora
    model = get_peft_model(LlamaForCausalLM(LlamaConfig(**TINY)), LoraConfig(**options))
    model.to(dtype).save_pretrained(str(folder))
    return folder


def peft_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "adapter_model.safetensors")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reads_every_lora_weight_exactly_in_each_dtype(tmp_path: Path, dtype: torch.dtype) -> None:
    folder = make_adapter(tmp_path, dtype, target_modules=ALL)
    adapter = read_peft_adapter(folder)
    assert (adapter.rank, adapter.alpha, adapter.scaling) == (4, 8.0, 2.0)
    assert adapter.target_modules == tuple(ALL)
    assert len(adapter.weights) == 2 * 7
    for key, value in peft_tensors(folder).items():
        parts = key.split(".")
        a, b = adapter.weights[(int(parts[4]), parts[6])]
        mine = a if parts[7] == "lora_A" else b
        assert mine.dtype == np.float32
        np.testing.assert_array_equal(mine, value.float().numpy())


def test_rslora_scaling_and_content_hash(tmp_path: Path) -> None:
    adapter = read_peft_adapter(make_adapter(tmp_path / "a", use_rslora=True, r=16))
    assert adapter.scaling == pytest.approx(8 / 4)  # alpha / sqrt(16)
    other = read_peft_adapter(make_adapter(tmp_path / "b", r=16))
    assert adapter.sha256 != other.sha256
    assert task_id(adapter.sha256) == int(adapter.sha256[:15], 16) < 2**60
    assert read_peft_adapter(tmp_path / "a").sha256 == adapter.sha256


def test_nvidia_layout_round_trips_with_scaling_in_b(tmp_path: Path) -> None:
    adapter = read_peft_adapter(make_adapter(tmp_path, target_modules=ALL, r=2, lora_alpha=6))
    weights, config = to_lora_tensors(adapter, np.float32)
    assert config.dtype == np.int32 and weights.dtype == np.float32
    assert weights.shape == (14, 2 * (24 + 16))  # the widest row: gate/up/down, r*(in+out)
    by_row = {(int(layer), int(module)): i for i, (module, layer, _) in enumerate(config)}
    # gate_proj is mlp_h_to_4h (5) and up_proj mlp_gate (7) in NVIDIA's converter.
    a, b = adapter.weights[(1, "gate_proj")]
    row = weights[by_row[(1, 5)]]
    np.testing.assert_array_equal(row[: a.size], a.reshape(-1))
    np.testing.assert_allclose(row[a.size : a.size + b.size], (b * 3.0).reshape(-1))
    q_row = weights[by_row[(0, 1)]]
    assert not q_row[2 * (16 + 16) :].any()  # shorter rows are zero-padded
    assert sorted({int(m) for m in config[:, 0]}) == [1, 2, 3, 4, 5, 6, 7]
    assert set(config[:, 2]) == {2}

    back = from_lora_tensors(weights[None], config[None], DIMS, num_layers=2)
    assert set(back) == set(adapter.weights)
    for key, (a, b) in adapter.weights.items():
        np.testing.assert_array_equal(back[key][0], a)
        np.testing.assert_allclose(back[key][1], b * 3.0, rtol=1e-6)


def test_fp16_tensors_are_the_rounded_fp32_ones(tmp_path: Path) -> None:
    adapter = read_peft_adapter(make_adapter(tmp_path))
    full, _ = to_lora_tensors(adapter, np.float32)
    half, _ = to_lora_tensors(adapter, np.float16)
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half, full.astype(np.float16))


def test_from_lora_tensors_refuses_what_the_engine_cannot_run(tmp_path: Path) -> None:
    adapter = read_peft_adapter(make_adapter(tmp_path, target_modules=["q_proj", "up_proj"]))
    weights, config = to_lora_tensors(adapter, np.float32)
    only_q = {"q_proj": DIMS["q_proj"]}
    with pytest.raises(AdapterError, match="module id 7"):
        from_lora_tensors(weights, config, only_q)
    with pytest.raises(AdapterError, match="layer 1, out of range"):
        from_lora_tensors(weights, config, DIMS, num_layers=1)
    with pytest.raises(AdapterError, match="needs"):
        from_lora_tensors(weights[:, :10], config, DIMS)
    with pytest.raises(AdapterError, match="rows"):
        from_lora_tensors(weights[:1], config, DIMS)


def rewrite_config(folder: Path, **changes: Any) -> Path:
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps(config | changes))
    return folder


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"use_dora": True}, "DoRA"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"bias": "all"}, "bias=all"),
        ({"rank_pattern": {"q_proj": 8}}, "rank_pattern"),
        ({"alpha_pattern": {"q_proj": 8}}, "alpha_pattern"),
        ({"layers_to_transform": [0]}, "layers_to_transform"),
        ({"r": 8}, "rank 4/4, the config says r=8"),
        ({"peft_type": "IA3"}, "LORA only"),
    ],
)
def test_refuses_unsupported_options_naming_the_adapter(
    tmp_path: Path, changes: dict[str, Any], reason: str
) -> None:
    folder = rewrite_config(make_adapter(tmp_path / "my-adapter"), **changes)
    with pytest.raises(AdapterError, match=f"my-adapter.*{reason}"):
        read_peft_adapter(folder)


def test_refuses_missing_corrupt_and_foreign_files(tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match=r"missing file adapter_config\.json"):
        read_peft_adapter(tmp_path / "nowhere")
    folder = make_adapter(tmp_path / "a")
    weights = folder / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-10])
    with pytest.raises(AdapterError, match=r"corrupt.*not fully covered"):
        read_peft_adapter(folder)
    weights.write_bytes(b"\xff" * 20)
    with pytest.raises(AdapterError, match="corrupt"):
        read_peft_adapter(folder)
    (folder / "adapter_config.json").write_text("{not json")
    with pytest.raises(AdapterError, match="not valid JSON"):
        read_peft_adapter(folder)
    weights.unlink()
    with pytest.raises(AdapterError, match=r"missing file adapter_model\.safetensors"):
        read_peft_adapter(folder)
    embed = make_adapter(tmp_path / "b", target_modules=["q_proj", "embed_tokens"])
    with pytest.raises(AdapterError, match=r"unexpected tensor .*embed_tokens"):
        read_peft_adapter(embed)


def _safetensors(header: dict[str, Any], body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
HOSTILE = [
    # A negative dimension: the hand-written reader raised an unexpected ValueError (a 500).
    _safetensors({Q_A: {"dtype": "F32", "shape": [-1, 4], "data_offsets": [0, 16]}}, b"\0" * 16),
    # A shape whose element count overflows, offsets past the end, a header longer than the file.
    _safetensors({Q_A: {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 16]}}, b""),
    _safetensors({Q_A: {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}, b"\0" * 8),
    struct.pack("<Q", 2**62) + b"{}",
    # A dtype no adapter has, and a header that is not an object.
    _safetensors({Q_A: {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8),
    _safetensors([1, 2], b""),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("weights", HOSTILE, ids=range(len(HOSTILE)))
def test_a_malformed_safetensors_header_is_refused_naming_the_adapter(
    tmp_path: Path, weights: bytes
) -> None:
    folder = make_adapter(tmp_path / "a")
    (folder / "adapter_model.safetensors").write_bytes(weights)
    with pytest.raises(AdapterError, match=r"^adapter hostile: adapter_model\.safetensors is "):
        read_peft_adapter(folder, name="hostile")


def test_files_over_max_bytes_are_refused_before_they_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = make_adapter(tmp_path / "a")
    size = sum(f.stat().st_size for f in folder.iterdir() if f.name.startswith("adapter_"))
    assert read_peft_adapter(folder, max_bytes=size).rank == 4  # the limit itself is allowed
    opened: list[Path] = []
    real_open = Path.open

    def recorded(self: Path, *args: Any, **options: Any) -> Any:
        opened.append(self)
        return real_open(self, *args, **options)

    monkeypatch.setattr(Path, "open", recorded)
    with pytest.raises(AdapterError, match=rf"^adapter a: its files are {size} bytes, over the "
                       rf"limit of {size - 1} \(ADAPTER_MAX_BYTES\)"):  # fmt: skip
        read_peft_adapter(folder, name="a", max_bytes=size - 1)
    assert opened == []  # refused on their size alone


def test_an_unreadable_file_is_named_without_its_folder(tmp_path: Path) -> None:
    folder = make_adapter(tmp_path / "secret-place")
    (folder / "adapter_model.safetensors").unlink()
    (folder / "adapter_model.safetensors").mkdir()  # a folder: reading it fails (EISDIR)
    with pytest.raises(AdapterError) as refused:
        read_peft_adapter(folder, name="x")
    assert "secret-place" not in str(refused.value) and "adapter_model" in str(refused.value)
