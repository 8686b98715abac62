"""scripts/gpu_smoke's adapter check without a GPU: the PEFT folder it writes, and the checks'
logic on a canned api and a canned triton container."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from safetensors.numpy import load_file

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "lib"))

import gpu_smoke_adapter as adapters  # noqa: E402
import gpu_smoke_checks as checks  # noqa: E402

# SmolLM2-135M-Instruct's sizes (the smoke checkpoint), two layers to keep it small.
CONFIG = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "num_hidden_layers": 2,
}


def test_the_adapter_is_a_peft_folder(tmp_path: Path) -> None:
    weights = adapters.make_weights(CONFIG)
    folder = adapters.write_adapter(tmp_path / "a", weights, base_model="smoke-model")
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == adapters.RANK
    assert config["base_model_name_or_path"] == "smoke-model"
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    assert len(tensors) == 2 * 2 * len(adapters.TARGETS)
    prefix = "base_model.model.model.layers.1"
    # PEFT's shapes: lora_A [r, in], lora_B [out, r]; v_proj is 3 KV heads of 64.
    assert tensors[f"{prefix}.self_attn.v_proj.lora_A.weight"].shape == (8, 576)
    assert tensors[f"{prefix}.self_attn.v_proj.lora_B.weight"].shape == (192, 8)
    assert tensors[f"{prefix}.mlp.up_proj.lora_B.weight"].shape == (1536, 8)
    # Not PEFT's zero B: the adapter must change the answer.
    assert np.abs(tensors[f"{prefix}.mlp.gate_proj.lora_B.weight"]).max() > 0
    again = adapters.make_weights(CONFIG)
    assert all(np.array_equal(weights[key][1], again[key][1]) for key in weights)  # seeded


class Api(httpx.MockTransport):
    """The api's adapter routes and completions; `answers` maps the request's model to text."""

    def __init__(self, answers: dict[str, str], status: int = 201) -> None:
        self.calls: list[tuple[str, str]] = []

        def handle(request: httpx.Request) -> httpx.Response:
            self.calls.append((request.method, request.url.path))
            body = json.loads(request.content) if request.content else {}
            if request.url.path == "/v1/models":
                return httpx.Response(200, json={"data": [{"id": "base"}]})
            if request.method == "DELETE":
                return httpx.Response(404, json={"detail": "no such adapter"})
            if request.url.path == "/v1/adapters":
                return httpx.Response(status, json=body | {"task_id": 2**59 + 7})
            text = answers[body["model"]]
            return httpx.Response(200, json={"choices": [{"text": text}]})

        super().__init__(handle)


def api(transport: Api) -> checks.Api:
    return checks.Api(httpx.Client(transport=transport, base_url="http://api"))


def test_register_then_two_adapter_answers() -> None:
    transport = Api({"gpu-smoke-lora": " approximately 21.5 million euros."})
    client = api(transport)
    adapter = adapters.register(client, "gpu-smoke-lora", "/models/gpu-smoke-lora")
    assert adapter["task_id"] == 2**59 + 7
    assert transport.calls[:2] == [
        ("DELETE", "/v1/adapters/gpu-smoke-lora"),  # a --keep run's leftover goes first
        ("POST", "/v1/adapters"),
    ]
    text = adapters.check_adapter(
        client, "gpu-smoke-lora", " Paris.", reference=" approximately 21.5 million"
    )
    assert text == " approximately 21.5 million euros."
    with pytest.raises(checks.SmokeFailure, match="is the base's"):
        adapters.check_adapter(client, "gpu-smoke-lora", text, reference=None)
    with pytest.raises(checks.SmokeFailure, match="does not start like reference"):
        adapters.check_adapter(client, "gpu-smoke-lora", " Paris.", reference=" Paris is")


def test_a_refused_adapter_fails_the_check() -> None:
    with pytest.raises(checks.SmokeFailure, match="register x: 400"):
        adapters.register(api(Api({}, status=400)), "x", "/models/x")


def in_triton(answers: dict[int, dict[str, Any]]) -> Any:
    """A triton container that runs the probe: the answer by the task id in its body."""

    def run(script: str) -> str:
        compile(script, "probe", "exec")  # it must at least be Python
        assert "/v2/models/ensemble/generate" in script
        task = next(task for task in answers if f"'lora_task_id': {task}" in script)
        return "some log line\n" + json.dumps(answers[task]) + "\n"

    return run


NOT_CACHED = "LoRA task 1 not found in cache. Please send LoRA weights with request"


def test_the_task_cache_probe() -> None:
    triton = in_triton(
        {1: {"error": NOT_CACHED}, 42: {"ok": {"text_output": " approximately 21.5 million"}}}
    )
    assert adapters.check_task_cache(triton, 42, " approximately 21.5 million") == NOT_CACHED
    served = in_triton({1: {"ok": {"text_output": "?"}}, 42: {"ok": {"text_output": "x"}}})
    with pytest.raises(checks.SmokeFailure, match="unknown task id answered"):
        adapters.check_task_cache(served, 42, "x")
    uncached = in_triton({1: {"error": NOT_CACHED}, 42: {"error": "not found in cache"}})
    with pytest.raises(checks.SmokeFailure, match="task 42 alone failed"):
        adapters.check_task_cache(uncached, 42, "x")


def test_steps_run_in_order_and_the_probe_needs_the_adapter(tmp_path: Path) -> None:
    refs = adapters.References(None, None, adapters.make_weights(CONFIG), base_answer=" Paris.")
    client = api(Api({"gpu-smoke-lora": " approximately 21.5 million euros."}))
    triton = in_triton(
        {
            1: {"error": NOT_CACHED},
            2**59 + 7: {"ok": {"text_output": " approximately 21.5 million"}},
        }
    )
    steps = adapters.steps(client, triton, refs, tmp_path)
    assert list(steps) == list(adapters.CHECKS)
    with pytest.raises(checks.SmokeFailure, match="nothing to probe"):
        steps["lora task cache"]()
    assert steps["adapter"]() == " approximately 21.5 million euros."
    config = json.loads((tmp_path / adapters.FOLDER / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "base"  # the id /v1/models serves
    assert steps["lora task cache"]() == NOT_CACHED
