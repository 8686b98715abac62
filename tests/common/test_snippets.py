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


SHA = "3f2a9c1b7d4e" + "5" * 52
WITH_ADAPTER = {"prompt": "Tell me about the sea.", "max_tokens": 8, "adapter": "pirate"}


def test_each_snippet_names_the_adapter_and_its_hash_and_still_runs() -> None:
    note = "# adapter pirate sha256:3f2a9c1b7d4e"
    curl = snippets.curl(WITH_ADAPTER, URL, api_key_required=False, adapter_sha256=SHA)
    assert curl.splitlines()[0] == note
    words = shlex.split(curl.replace("\\\n", " "), comments=True)  # as a shell reads it
    assert words[:2] == ["curl", f"{URL}/v1/predictions"]
    assert json.loads(words[words.index("-d") + 1])["input"] == WITH_ADAPTER
    for stream in (True, False):
        python = snippets.python(WITH_ADAPTER, URL, api_key_required=True, adapter_sha256=SHA,
                                 stream=stream)  # fmt: skip
        assert python.splitlines()[0] == note
        ast.parse(python)

    text = snippets.openai(WITH_ADAPTER, URL, api_key_required=False, adapter_sha256=SHA)
    assert text.splitlines()[0] == note
    tree = ast.parse(text)
    # On the OpenAI routes the adapter is a model of its own: `model=model`, model = "pirate".
    assigned = {
        node.targets[0].id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    assert ast.literal_eval(assigned["model"]) == "pirate"
    call = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "client.completions.create"
    )
    assert ast.unparse(next(k.value for k in call.keywords if k.arg == "model")) == "model"
    assert "adapter" not in ast.unparse(call)  # not an extra_body field there


def test_without_an_adapter_or_its_hash() -> None:
    for make in (snippets.curl, snippets.openai):
        assert "# adapter" not in make(BODY, URL, api_key_required=False, adapter_sha256=SHA)
    unknown = snippets.python(WITH_ADAPTER, URL, api_key_required=False)  # hash not known
    assert unknown.splitlines()[0] == "# adapter pirate"


def test_an_odd_adapter_name_stays_inside_its_comment() -> None:
    odd = WITH_ADAPTER | {"adapter": "x\nimport shutil; shutil.rmtree('/')\r"}
    text = snippets.python(odd, URL, api_key_required=False, adapter_sha256=SHA)
    tree = ast.parse(text)
    assert not any(isinstance(node, ast.Import) and node.names[0].name == "shutil"
                   for node in tree.body)  # fmt: skip
    assert text.splitlines()[0].startswith('# adapter "x\\nimport shutil')
    curl = snippets.curl(odd, URL, api_key_required=False, adapter_sha256=SHA)
    assert shlex.split(curl.replace("\\\n", " "), comments=True)[0] == "curl"


def test_openai_asks_for_the_guide_the_openai_way() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    cases = [
        ({"guide_type": "json"}, "response_format", {"type": "json_object"}),
        (
            {"guide_type": "json_schema", "guide": json.dumps(schema)},
            "response_format",
            {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema, "strict": True},
            },
        ),
        ({"guide_type": "regex", "guide": "[0-9]+"}, "guided_regex", "[0-9]+"),
        ({"guide_type": "ebnf_grammar", "guide": 'root ::= "a"'}, "guided_grammar", 'root ::= "a"'),
    ]
    for guide, name, value in cases:
        code = snippets.openai(
            {"prompt": "Hi", "guided_decoding": guide}, "http://h:8080", api_key_required=False
        )
        call = next(
            node
            for node in ast.walk(ast.parse(code))
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "client.completions.create"
        )
        found = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg != "model"}
        sent = found if name == "response_format" else found["extra_body"]
        assert sent[name] == value, code
