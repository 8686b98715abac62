"""'Copy as curl / Python / openai': valid code that asks the api the same, never the key."""

from __future__ import annotations

import ast
import json
import shlex

from tritonbox_common import snippets

BODY = {
    "prompt": 'Say "hi" to O\'Brien\n',
    "max_tokens": 12,
    "temperature": 0.0,
    "top_k": 40,
    "seed": 7,
    "stop_words_list": ["\n", "."],
    "bad_words_list": ["Lyon"],
}
URL = "http://api.example:8080"


def test_curl_posts_the_exact_body() -> None:
    text = snippets.curl(BODY, URL, api_key_required=False)
    words = shlex.split(text.replace("\\\n", " "))
    assert words[:2] == ["curl", f"{URL}/v1/predictions"]
    body = json.loads(words[words.index("-d") + 1])
    assert body == {"input": BODY, "stream": False}
    assert "Authorization" not in text


def test_curl_reads_the_key_from_the_environment() -> None:
    text = snippets.curl(BODY, URL, api_key_required=True)
    assert '-H "Authorization: Bearer $API_KEY"' in text


def test_python_is_valid_and_sends_the_body() -> None:
    text = snippets.python(BODY, URL, api_key_required=True)
    tree = ast.parse(text)
    bodies = [
        ast.literal_eval(keyword.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for keyword in node.keywords
        if keyword.arg == "json"
    ]
    assert bodies == [{"input": BODY, "stream": True}]
    assert "os.environ['API_KEY']" in text


def test_openai_maps_parameters_to_the_sdk_and_extra_body() -> None:
    text = snippets.openai(BODY, URL, api_key_required=False)
    call = next(
        node
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "client.completions.create"
    )
    arguments = {k.arg: k.value for k in call.keywords}
    assert ast.literal_eval(arguments["prompt"]) == BODY["prompt"]
    assert ast.literal_eval(arguments["stop"]) == ["\n", "."]
    assert ast.literal_eval(arguments["seed"]) == 7
    assert ast.literal_eval(arguments["extra_body"]) == {"top_k": 40, "bad_words": ["Lyon"]}
    assert f'base_url="{URL}/v1"' in text


def test_openai_chat_uses_chat_completions() -> None:
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    text = snippets.openai(chat, URL, api_key_required=True)
    ast.parse(text)
    assert "client.chat.completions.create(" in text
    assert 'api_key=os.environ["API_KEY"]' in text
