"""Small random LoRA adapters for the default model, made with peft at test time, and the
transformers + peft greedy reference the engine must reproduce."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM
from tritonbox_testing.reference import engine_model, greedy_ids

from tritonbox_common.lora import read_peft_adapter, task_id, to_lora_tensors

EOS = 2
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load_base(model_dir: Path) -> Any:
    """The base as the engine runs it (reference.py): peft keeps the adapters in float32."""
    return engine_model(model_dir)


def make_adapter(model_dir: Path, folder: Path, seed: int, **options: Any) -> Path:
    """A peft adapter with A and B both random: peft's default B = 0 would change nothing."""
    torch.manual_seed(seed)
    # The stock model: any of its linear layers may be targeted (the engine's float32 head is
    # not an nn.Linear); the adapter's own weights are random either way.
    stock = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = get_peft_model(stock, LoraConfig(**options))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn_like(param) * 0.05)
    peft_model.save_pretrained(str(folder))
    return folder


def hub_snapshot(cache_dir: Path, repo: str, adapter: Path, commit: str, ref: str = "main") -> Path:
    """`adapter`'s files as commit `commit` of Hugging Face repo `repo` in CACHE_DIR/hub, laid
    out as huggingface_hub's download leaves them, with branch or tag `ref` pointing at it (the
    hub is not reachable from tests: in offline mode huggingface_hub answers from this)."""
    storage = cache_dir / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(adapter / name, snapshot / name)
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / ref).write_text(commit)
    return snapshot


def reference_model(model_dir: Path, adapters: dict[str, Path]) -> Any:
    """One base with every adapter loaded under its name (switched by `reference`)."""
    names = iter(adapters.items())
    first, folder = next(names)
    model = PeftModel.from_pretrained(load_base(model_dir), str(folder), first)
    for name, path in names:
        model.load_adapter(str(path), name)
    return model.eval()


def reference(
    peft_model: Any, prompt: list[int], adapter: str | None, max_tokens: int
) -> list[int]:
    """Greedy `generate()` with `adapter` (None = the bare base), its final eos included."""
    if adapter is None:
        with peft_model.disable_adapter():
            return greedy_ids(peft_model, prompt, max_tokens, EOS)
    peft_model.set_adapter(adapter)
    return greedy_ids(peft_model, prompt, max_tokens, EOS)


def lora_inputs(folder: Path, *, with_weights: bool = True) -> dict[str, np.ndarray[Any, Any]]:
    """The tensorrt_llm step's LoRA tensors for `folder` (batch dim 1), fp32 as the cpu engine."""
    adapter = read_peft_adapter(folder)
    tensors = {"lora_task_id": np.array([[task_id(adapter.sha256)]], dtype=np.uint64)}
    if with_weights:
        weights, config = to_lora_tensors(adapter, np.float32)
        tensors |= {"lora_weights": weights[None], "lora_config": config[None]}
    return tensors
