"""Two bounds of issue 42 through the live api on the real cpu engine: a guide xgrammar compiles
for longer than GUIDE_COMPILE_TIMEOUT_S is a 400 naming the client's field and the limit (the
engine keeps serving), and `echo` with `logprobs` past ECHO_MAX_PROMPT_TOKENS is a 400 naming
`echo` and the limit, which GET /v1/limits reports. The engine's own side of both is tested in
tests/triton/engine/test_guide_pool.py and test_prompt_logprobs*.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tritonbox_testing.api_process import RunningApi, launch_api

ECHO_LIMIT = 8
# 40 characters, about 6 s of xgrammar's time on this machine (1.5 s a distinct repetition).
SLOW_REGEX = "".join(f".{{1,{1000 + i}}}{'abcd'[i]}" for i in range(4))


@pytest.fixture(scope="module")
def api(
    triton_launcher: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningApi]:
    with triton_launcher(guide_compile_timeout_s=0.5) as triton:
        running = launch_api(
            triton, Path(tmp_path_factory.mktemp("api")), echo_max_prompt_tokens=str(ECHO_LIMIT)
        )
        try:
            running.wait_ready()
            yield running
        finally:
            running.stop()


def _model(api: RunningApi) -> str:
    model: str = httpx.get(f"{api.url}/v1/models", timeout=30).json()["data"][0]["id"]
    return model


def test_a_guide_slower_than_the_limit_is_a_400_naming_the_field_and_the_limit(
    api: RunningApi,
) -> None:
    body = {
        "model": _model(api),
        "messages": [{"role": "user", "content": "Say anything."}],
        "max_tokens": 4,
        "guided_regex": SLOW_REGEX,
    }
    answer = httpx.post(f"{api.url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "guided_regex", error
    assert "within the engine's limit of 0.5 s (GUIDE_COMPILE_TIMEOUT_S)" in error["message"]
    # The engine serves on, a cheap guide included.
    body["guided_regex"] = "(yes|no)"
    answer = httpx.post(f"{api.url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] in ("yes", "no")


def test_echo_with_logprobs_past_the_limit_is_a_400_naming_echo_and_the_limit(
    api: RunningApi,
) -> None:
    limits = httpx.get(f"{api.url}/v1/limits", timeout=30).json()
    assert limits["echo_max_prompt_tokens"] == ECHO_LIMIT
    model = _model(api)
    long = "one two three four five six seven eight nine ten eleven twelve"
    body = {"model": model, "prompt": long, "max_tokens": 0, "echo": True, "logprobs": 1}
    answer = httpx.post(f"{api.url}/v1/completions", json=body, timeout=120)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "echo"
    assert error["message"].startswith(
        f"echo: with logprobs the prompt may be at most {ECHO_LIMIT} tokens "
        "(ECHO_MAX_PROMPT_TOKENS), got "
    ), error
    # Within the limit it is scored; without logprobs nothing is scored, so no limit applies.
    short = {**body, "prompt": "one two three"}
    answer = httpx.post(f"{api.url}/v1/completions", json=short, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["logprobs"]["token_logprobs"][1] is not None
    plain = {**body, "max_tokens": 2}
    del plain["logprobs"]
    answer = httpx.post(f"{api.url}/v1/completions", json=plain, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"].startswith(long)
