"""scripts/gpu_smoke without a GPU: its dry run (what CI can prove of the GPU smoke test), and the
pieces it is made of — the compose override, the checks' logic on canned api answers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "lib"))

import gpu_smoke_checks as checks  # noqa: E402
import gpu_smoke_plan as plan  # noqa: E402


def test_dry_run_checks_the_plan_offline() -> None:
    result = subprocess.run(
        [str(REPO / "scripts" / "gpu_smoke"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "nvcr.io/nvidia/tensorrt-llm/release:0.20.0 python3 scripts/build_engine.py" in out
    assert "--kv_cache_type=paged" in out and "--max_num_tokens=8192" in out
    assert "passes the engine check with the smoke settings" in out
    assert "the api accepts every smoke request" in out
    assert (
        "it serves rank-8 adapters on q_proj k_proj v_proj o_proj gate_proj up_proj down_proj"
        in out
    )
    assert "the smoke adapter reads as PEFT and converts to 120 lora_weights rows" in out
    assert "dry run: nothing built or started" in out


def test_the_override_beats_a_developers_env_file() -> None:
    override = plan.compose_override()
    assert 'MAX_INPUT_LEN: "512"' in override and 'KV_CACHE_MAX_TOKENS: "0"' in override
    assert override.startswith("services:\n  triton:\n    environment:\n")


def test_the_described_engine_is_what_the_check_reads() -> None:
    build_engine = plan.load_build_engine()
    args = build_engine.parse_args(plan.build_arguments())
    config: Any = plan.expected_engine_config(build_engine.build_command(args, Path("/c")))
    assert config["build_config"]["max_seq_len"] == 768  # 512 + 256
    assert config["build_config"]["plugin_config"]["use_paged_context_fmha"] is True


class Canned(httpx.MockTransport):
    """An api answering from a table of (method, path) -> JSON or SSE lines."""

    def __init__(self, table: dict[tuple[str, str], Any]) -> None:
        def handle(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content) if request.content else {}
            answer = table[(request.method, request.url.path)]
            value = answer(body) if callable(answer) else answer
            if isinstance(value, list):  # server-sent events
                text = "".join(f"{line}\n" for line in value)
                headers = {"X-Prediction-Id": "p1", "content-type": "text/event-stream"}
                return httpx.Response(200, text=text, headers=headers)
            return httpx.Response(200, json=value)

        super().__init__(handle)


def completion_answer(body: dict[str, Any]) -> Any:
    text = " Paris, the city of light."
    if body.get("stream"):
        chunks = [" Paris,", " the city", " of light."]
        lines = [f"data: {json.dumps({'choices': [{'text': c}]})}" for c in chunks]
        return [*lines, "data: [DONE]"]
    if body.get("stop"):
        return {"choices": [{"text": text[: text.index(body["stop"][0])], "finish_reason": "stop"}]}
    return {"choices": [{"text": text, "finish_reason": "length"}]}


def test_the_checks_on_a_canned_api() -> None:
    table: dict[tuple[str, str], Any] = {
        ("GET", "/v1/models"): {"data": [{"id": "m"}]},
        ("POST", "/v1/completions"): completion_answer,
    }
    api = checks.Api(httpx.Client(transport=Canned(table), base_url="http://api"))
    greedy = checks.check_greedy(api, api.model(), reference=" Paris, the city of lights")
    assert greedy == " Paris, the city of light."
    assert checks.check_streaming(api, "m", greedy) == 3
    assert checks.check_stop_words(api, "m", greedy) == "city"
    with pytest.raises(checks.SmokeFailure, match="does not start like reference"):
        checks.check_greedy(api, "m", reference=" London is")


def test_cancellation_must_end_as_canceled() -> None:
    status = {"value": "canceled"}
    table: dict[tuple[str, str], Any] = {
        ("POST", "/v1/predictions"): ["event: output", "data: Once", "event: output", "data: upon"],
        ("POST", "/v1/predictions/p1/cancel"): {},
        ("GET", "/v1/predictions/p1"): lambda _: {
            "status": status["value"],
            "metrics": {"completion_tokens": 3},
        },
    }
    api = checks.Api(httpx.Client(transport=Canned(table), base_url="http://api"))
    assert checks.check_cancellation(api, max_tokens=256) == 3
    status["value"] = "succeeded"
    with pytest.raises(checks.SmokeFailure, match="ended as succeeded"):
        checks.check_cancellation(api, max_tokens=256, timeout_s=0)
