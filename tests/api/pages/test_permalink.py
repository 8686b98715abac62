"""The permalink page: what it shows, that user text is always escaped, and runnable snippets."""

from __future__ import annotations

import ast
import json
import re
import shlex
from datetime import UTC, datetime
from html import unescape
from typing import Any

import pytest

from tritonbox_api.db.models import FinishReason, Prediction, Source, Status
from tritonbox_api.pages.permalink import render_not_found, render_permalink

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
EVIL = f"{SCRIPT} {IMG} it's"
PUBLIC = "https://box.example"
PLAYGROUND = "https://play.example"


def _prediction(**overrides: Any) -> Prediction:
    values: dict[str, Any] = dict(
        id="AbCdEfGh12345678_-abcdefghijklmn",
        status=Status.SUCCEEDED,
        source=Source.API,
        model="tiny-llama",
        input={"prompt": "Tell me a joke", "max_tokens": 20},
        applied={
            "prompt": "Tell me a joke",
            "messages": None,
            "engine_prompt": "Tell me a joke",
            "max_tokens": 20,
            "temperature": 0.7,
            "seed": 1234,
            "stop_words_list": [],
            "beam_width": 1,
        },
        output="Why did the chicken cross the road?",
        finish_reason=FinishReason.LENGTH,
        prompt_tokens=5,
        completion_tokens=20,
        time_to_first_token_s=0.0421,
        time_per_output_token_s=0.0123,
        total_time_s=0.2758,
        tokens_per_second=72.52,
        created_at=datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC),
        started_at=datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC),
        completed_at=datetime(2025, 3, 4, 5, 6, 8, tzinfo=UTC),
    )
    values.update(overrides)
    return Prediction(**values)


def _render(prediction: Prediction, **options: Any) -> str:
    return render_permalink(prediction, public_url=PUBLIC, playground_url=PLAYGROUND, **options)


def _pre(html: str, element_id: str) -> str:
    match = re.search(rf'<pre id="{element_id}">(.*?)</pre>', html, re.S)
    assert match is not None
    return unescape(match.group(1))


def test_shows_the_prediction() -> None:
    html = _render(_prediction())
    assert "<title>Prediction AbCdEfGh · TritonBox</title>" in html
    assert 'class="badge succeeded">succeeded<' in html
    for text in ("tiny-llama", "api", "2025-03-04 05:06:07 UTC", "Tell me a joke"):
        assert text in html
    assert "Why did the chicken cross the road?" in html
    # Metrics: ms for the per-token times, seconds for the total.
    for text in ("42 ms", "12 ms", "0.28 s", "72.5", ">20<", ">5<", "length"):
        assert text in html
    # Settings, without the prompt fields (shown above instead).
    assert "<th>temperature</th><td>0.7</td>" in html
    assert "<th>engine_prompt</th>" not in html
    assert f'href="{PLAYGROUND}/?p=AbCdEfGh12345678_-abcdefghijklmn"' in html
    assert 'http-equiv="refresh"' not in html  # a finished prediction does not reload


def test_names_the_stop_word_that_ended_it_escaped() -> None:
    html = _render(_prediction(finish_reason=FinishReason.STOP_WORD, stop_word=f"\n{SCRIPT}"))
    assert "stop_word &#34;\\n&lt;script&gt;alert(1)&lt;/script&gt;&#34;" in html
    assert SCRIPT not in html


def test_running_prediction() -> None:
    html = _render(_prediction(status=Status.PROCESSING, output="Why", finish_reason=None))
    assert 'class="badge processing">processing<' in html
    assert "Still processing" in html
    assert 'http-equiv="refresh"' in html


def test_failed_prediction_shows_its_error() -> None:
    html = _render(
        _prediction(
            status=Status.FAILED,
            output="",
            error="Triton is unavailable: connection refused",
            finish_reason=FinishReason.ERROR,
            time_to_first_token_s=None,
            time_per_output_token_s=None,
        )
    )
    assert 'class="badge failed">failed<' in html
    assert '<pre class="error">Triton is unavailable: connection refused</pre>' in html
    assert "<th>Time to first token</th><td>–</td>" in html


def test_chat_messages() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    applied = {"prompt": None, "messages": messages, "engine_prompt": "<|user|>Hi", "seed": 1}
    html = _render(_prediction(input={"messages": messages}, applied=applied))
    assert "<h2>Messages</h2>" in html and "<h2>Prompt</h2>" not in html
    assert '<div class="role">system</div>' in html and "<pre>Be brief.</pre>" in html
    assert "&lt;|user|&gt;Hi" in html  # the chat template's result, escaped
    body = json.loads(shlex.split(_pre(html, "curl").replace("\\\n", " "))[-1])
    assert body == {"input": {"messages": messages, "seed": 1}, "stream": False}


@pytest.mark.parametrize("field", ["prompt", "output", "error", "model", "messages", "settings"])
def test_user_text_is_escaped(field: str) -> None:
    cases: dict[str, dict[str, Any]] = {
        "prompt": {"input": {"prompt": EVIL}, "applied": {"prompt": EVIL}},
        "output": {"output": EVIL},
        "error": {"error": EVIL, "status": Status.FAILED},
        "model": {"model": EVIL},
        "messages": {"input": {"messages": [{"role": EVIL, "content": EVIL}]}},
        "settings": {"applied": {"stop_words_list": [EVIL], EVIL: 1}},
    }
    overrides = cases[field]
    html = _render(_prediction(**overrides))
    assert SCRIPT not in html and "<img" not in html and IMG not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert html.count("<script>") == 1  # only the page's own copy button script


def test_not_found_page() -> None:
    html = render_not_found(EVIL)
    assert "Prediction not found" in html
    assert SCRIPT not in html and "<img" not in html and "<script>" not in html
    assert (
        "&lt;script&gt;alert(1)&lt;/script&gt; &#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in html
    )


def test_curl_snippet_recreates_the_request() -> None:
    prompt = f"Say {EVIL}\nnow"
    applied = {"prompt": prompt, "messages": None, "engine_prompt": prompt, "seed": 9, "top_k": 0}
    html = _render(_prediction(input={"prompt": prompt}, applied=applied))
    command = shlex.split(_pre(html, "curl").replace("\\\n", " "))
    assert command[:2] == ["curl", f"{PUBLIC}/v1/predictions"]
    assert "Authorization: Bearer $API_KEY" not in command
    expected = {"prompt": prompt, "seed": 9, "top_k": 0}
    assert json.loads(command[-1]) == {"input": expected, "stream": False}
    with_key = shlex.split(_pre(_render(_prediction(), api_key_required=True), "curl"))
    assert "Authorization: Bearer $API_KEY" in with_key


def test_python_snippet_recreates_the_request() -> None:
    prompt = f"Say {EVIL}\nnow ✓"
    applied = {"prompt": prompt, "seed": 9, "stop_words_list": ["\n\n", 'a"b'], "flag": True}
    html = _render(_prediction(input={"prompt": prompt}, applied=applied))
    source = _pre(html, "python")
    tree = ast.parse(source)  # valid Python
    assert "import httpx" in source and "httpx.post(" in source
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call))
    keywords = {keyword.arg: keyword.value for keyword in call.keywords}
    assert ast.literal_eval(call.args[0]) == f"{PUBLIC}/v1/predictions"
    expected = {"prompt": prompt, "seed": 9, "stop_words_list": ["\n\n", 'a"b']}
    assert ast.literal_eval(keywords["json"]) == {"input": expected, "stream": False}
    keyed = _pre(_render(_prediction(), api_key_required=True), "python")
    ast.parse(keyed)
    assert "os.environ['API_KEY']" in keyed


def test_python_snippet_spells_python_constants() -> None:
    applied: dict[str, Any] = {
        "prompt": "x",
        "seed": None,
        "stop_words_list": [],
        "temperature": 0.0,
    }
    source = _pre(_render(_prediction(applied=applied)), "python")
    assert "null" not in source and "true" not in source
    assert '"stop_words_list": []' in source and '"temperature": 0.0' in source


def test_snippets_name_the_adapter_that_answered_by_its_hash() -> None:
    sha = "3f2a9c1b7d4e" + "5" * 52
    asked = {"prompt": "Tell me a joke", "adapter": "pirate", "seed": 3}
    html = _render(
        _prediction(input=asked, applied=asked, adapter_name="pirate", adapter_sha256=sha),
        api_key_required=True,
    )
    for element_id in ("curl", "python"):
        assert _pre(html, element_id).startswith("# adapter pirate sha256:3f2a9c1b7d4e\n")
    ast.parse(_pre(html, "python"))
    command = shlex.split(_pre(html, "curl").replace("\\\n", " "), comments=True)
    assert json.loads(command[-1])["input"]["adapter"] == "pirate"
    assert "# adapter" not in _pre(_render(_prediction()), "curl")  # the base model: no line
