"""The GPU smoke test's adapter check (scripts/gpu_smoke): a LoRA adapter made here, registered
through the api and used with `model=<adapter>`, then NVIDIA's task cache probed inside Triton.

The adapter is a PEFT folder (adapter_config.json + adapter_model.safetensors) of seeded random
weights on q_proj, v_proj, gate_proj and up_proj of the smoke checkpoint — the last two because
HF gate_proj is TensorRT-LLM's mlp_h_to_4h and up_proj its mlp_gate, the mapping a conversion
gets wrong most easily. Its reference answer is transformers' greedy answer with the adapter's
update merged into the same checkpoint's weights (W + alpha/r * B @ A), so the GPU's answer
checks the whole conversion (module ids, A/B order, scaling), not just "something changed".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gpu_smoke_checks import PROMPT, Api, completion, expect

NAME = "gpu-smoke-lora"
FOLDER = Path("models") / NAME  # under ./models: the api container sees it as /models/NAME
RANK, ALPHA = 8, 16.0
TARGETS = ("q_proj", "v_proj", "gate_proj", "up_proj")
# The probe's task id for "never sent": TritonBox's ids are 60-bit content hashes, never 1.
UNKNOWN_TASK = 1

Matrix = np.ndarray[Any, np.dtype[np.float32]]
Weights = dict[tuple[int, str], tuple[Matrix, Matrix]]


def shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) of each target projection of a Llama checkpoint's config.json."""
    hidden, mlp = int(config["hidden_size"]), int(config["intermediate_size"])
    head = int(config.get("head_dim") or hidden // int(config["num_attention_heads"]))
    kv = int(config["num_key_value_heads"]) * head
    q = int(config["num_attention_heads"]) * head
    every = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv)}
    every |= {"gate_proj": (hidden, mlp), "up_proj": (hidden, mlp)}
    return {name: every[name] for name in TARGETS}


def make_weights(config: dict[str, Any], seed: int = 0) -> Weights:
    """A [r, in] and B [out, r] per (layer, module), float32. B is not zero (PEFT's initial
    value) so the adapter changes the answer; small enough that the answer stays language."""
    rng = np.random.default_rng(seed)
    weights: Weights = {}
    for layer in range(int(config["num_hidden_layers"])):
        for module, (fan_in, fan_out) in shapes(config).items():
            a = rng.normal(0.0, 1.0 / np.sqrt(fan_in), (RANK, fan_in)).astype(np.float32)
            b = rng.normal(0.0, 0.2 / np.sqrt(RANK), (fan_out, RANK)).astype(np.float32)
            weights[(layer, module)] = (a, b)
    return weights


def module_path(layer: int, module: str) -> str:
    part = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
    return f"base_model.model.model.layers.{layer}.{part}.{module}"


def write_adapter(folder: Path, weights: Weights, base_model: str) -> Path:
    """Write the PEFT folder PEFT's save_pretrained would (LoRA, no bias, no dropout)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {}
    for (layer, module), (a, b) in weights.items():
        tensors[f"{module_path(layer, module)}.lora_A.weight"] = a
        tensors[f"{module_path(layer, module)}.lora_B.weight"] = b
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def reference_greedy(checkpoint: Path, weights: Weights) -> str:
    """transformers' greedy answer with W + alpha/r * B @ A merged in (CPU, fp32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True)
    layers = model.model.layers
    with torch.no_grad():
        for (layer, module), (a, b) in weights.items():
            block = layers[layer].self_attn if module.endswith(("q_proj", "v_proj")) else None
            linear = getattr(block or layers[layer].mlp, module)
            linear.weight += torch.from_numpy((ALPHA / RANK) * (b @ a))
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=32, do_sample=False)
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def register(api: Api, name: str, source: str) -> dict[str, Any]:
    """POST /v1/adapters, replacing an adapter of that name left by an earlier --keep run."""
    api.client.delete(f"/v1/adapters/{name}")  # 404 when absent: fine
    answer = api.client.post("/v1/adapters", json={"name": name, "source": source})
    expect(answer.status_code == 201, f"register {name}: {answer.status_code} {answer.text}")
    adapter: dict[str, Any] = answer.json()
    expect(int(adapter.get("task_id") or 0) > 0, f"register {name}: no task_id in {adapter}")
    return adapter


def check_adapter(api: Api, adapter: str, base_greedy: str, reference: str | None) -> str:
    """Twice `model=<adapter>`: the same greedy text both times (the second request is the one
    the api sends with lora_task_id alone), other than the base's, like the CPU reference."""
    first = api.complete(completion(adapter))["choices"][0]["text"]
    second = api.complete(completion(adapter))["choices"][0]["text"]
    expect(bool(first.strip()), f"adapter answer is empty: {first!r}")
    expect(first == second, f"adapter answers differ: {first!r} / {second!r}")
    expect(first != base_greedy, f"adapter answer is the base's: {first!r}")
    if reference is not None:
        same = first.split()[:3] == reference.split()[:3]
        expect(same, f"GPU adapter {first!r} does not start like reference {reference!r}")
    return str(first)


def probe_script(task_id: int) -> str:
    """Python for the triton container (standard library only): one greedy ensemble request
    with lora_task_id alone, straight to Triton; prints {"ok": answer} or {"error": text}."""
    body = {"text_input": PROMPT, "max_tokens": 32, "top_k": 1, "lora_task_id": task_id}
    return (
        "import json, urllib.error, urllib.request as u\n"
        f"body = json.dumps({body!r}).encode()\n"
        "r = u.Request('http://127.0.0.1:8000/v2/models/ensemble/generate', data=body,\n"
        "    headers={'Content-Type': 'application/json'})\n"
        "try:\n"
        "    print(json.dumps({'ok': json.load(u.urlopen(r, timeout=120))}))\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(json.dumps({'error': e.read().decode(errors='replace')}))\n"
    )


def check_task_cache(in_triton: Callable[[str], str], task_id: int, adapter_text: str) -> str:
    """NVIDIA's cache, as the api relies on it: an id never sent fails with the error the api
    matches ("not found in cache"), and the adapter's id alone, after the api's first use,
    serves the adapter."""
    unknown = json.loads(in_triton(probe_script(UNKNOWN_TASK)).strip().splitlines()[-1])
    error = str(unknown.get("error", ""))
    expect("not found in cache" in error, f"unknown task id answered {unknown}")
    cached = json.loads(in_triton(probe_script(task_id)).strip().splitlines()[-1])
    expect("ok" in cached, f"task {task_id} alone failed: {cached}")
    text = str(cached["ok"].get("text_output", ""))
    same = text.split()[:3] == adapter_text.split()[:3]
    expect(same, f"task {task_id} alone answered {text!r}, the api {adapter_text!r}")
    return error


CHECKS = ("adapter", "lora task cache")


@dataclass
class References:
    """What the GPU's answers are compared with: transformers on the same checkpoint (None =
    --no-reference), the adapter's weights, and the base's GPU answer once the greedy check ran."""

    base: str | None
    adapter: str | None
    weights: Weights
    base_answer: str = ""


def references(checkpoint: Path, base_greedy: Callable[[Path], str], skip: bool) -> References:
    weights = make_weights(json.loads((checkpoint / "config.json").read_text()))
    if skip:
        return References(None, None, weights)
    return References(base_greedy(checkpoint), reference_greedy(checkpoint, weights), weights)


def steps(
    api: Api, in_triton: Callable[[str], str], refs: References, repo: Path = Path(".")
) -> dict[str, Callable[[], object]]:
    """The adapter checks, in order; the second needs what the first registered."""
    seen: dict[str, Any] = {}

    def register_and_use() -> str:
        # The api compares an adapter's base with the model it serves: name the served one.
        write_adapter(repo / FOLDER, refs.weights, base_model=api.model())
        seen["adapter"] = register(api, NAME, f"/{FOLDER}")
        seen["text"] = check_adapter(api, NAME, refs.base_answer, refs.adapter)
        return str(seen["text"])

    def task_cache() -> str:
        expect("adapter" in seen, "the adapter check failed: nothing to probe")
        return check_task_cache(in_triton, int(seen["adapter"]["task_id"]), seen["text"])

    return dict(zip(CHECKS, (register_and_use, task_cache), strict=True))
