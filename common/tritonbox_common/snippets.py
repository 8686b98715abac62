"""Code that asks the api for a prediction: "copy as curl / Python / openai" on the permalink
page and in the playground, from one `input` (GenerationInput's fields).

Each snippet reads the key from the environment ($API_KEY) when the api needs one: no page ever
shows the real key. With an adapter, each starts with a comment naming it and the sha256 of its
files (`# adapter pirate sha256:3f2a9c1b7d4e`): the name alone may later be re-registered with
other weights, and the hash says which ones produced (or will produce) the answer.
"""

from __future__ import annotations

import json
import re
from typing import Any

SHORT_SHA = 12  # hex digits of an adapter's sha256 shown: enough to tell two versions apart
# A registered adapter's name (the api's pattern); anything else is quoted to stay one line.
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# GenerationInput name -> the openai SDK's own argument; the rest go in `extra_body`.
_OPENAI_ARGUMENTS = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "stop_words_list": "stop",
}
_OPENAI_EXTRAS = {
    "top_k": "top_k",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "bad_words_list": "bad_words",
    "ignore_eos": "ignore_eos",
}


def _openai_guide(guide: Any) -> tuple[str, Any] | None:
    """`guided_decoding` as the OpenAI routes take it: (argument or extra field, value)."""
    if not isinstance(guide, dict):
        return None
    kind, text = guide.get("guide_type"), guide.get("guide")
    if kind == "json":
        return "response_format", {"type": "json_object"}
    if kind == "json_schema" and isinstance(text, str):
        schema = {"name": "answer", "schema": json.loads(text), "strict": True}
        return "response_format", {"type": "json_schema", "json_schema": schema}
    extra = {"regex": "guided_regex", "ebnf_grammar": "guided_grammar"}.get(str(kind))
    return (extra, text) if extra else None


def python_literal(value: Any, indent: int = 0) -> str:
    """`value` (JSON data) as Python source, one item per line like a formatter would."""
    pad, inner = " " * indent, " " * (indent + 4)
    if isinstance(value, dict) and value:
        items = [
            f"{inner}{json.dumps(str(k))}: {python_literal(v, indent + 4)},"
            for k, v in value.items()
        ]
        return "{\n" + "\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and value:
        items = [f"{inner}{python_literal(v, indent + 4)}," for v in value]
        return "[\n" + "\n".join(items) + f"\n{pad}]"
    if value is None or isinstance(value, bool):
        return repr(value)
    # JSON's string escapes and number spellings are valid Python.
    return json.dumps(value, ensure_ascii=False)


def adapter_comment(generation_input: dict[str, Any], adapter_sha256: str | None) -> str:
    """`# adapter <name> sha256:<prefix>` and a newline ("" without an adapter): a comment in
    shell and in Python alike, so every snippet stays runnable."""
    adapter = generation_input.get("adapter")
    if not adapter:
        return ""
    name = str(adapter)
    shown = name if _PLAIN_NAME.match(name) else json.dumps(name)  # never a second line
    known = f" sha256:{adapter_sha256[:SHORT_SHA]}" if adapter_sha256 else ""
    return f"# adapter {shown}{known}\n"


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def curl(
    generation_input: dict[str, Any],
    api_url: str,
    *,
    api_key_required: bool,
    adapter_sha256: str | None = None,
) -> str:
    body = {"input": generation_input, "stream": False}
    auth = '  -H "Authorization: Bearer $API_KEY" \\\n' if api_key_required else ""
    data = json.dumps(body, indent=2, ensure_ascii=False)
    return (
        f"{adapter_comment(generation_input, adapter_sha256)}"
        f"curl {api_url}/v1/predictions \\\n"
        "  -H 'Content-Type: application/json' \\\n"
        f"{auth}  -d {_shell_quote(data)}"
    )


def python(
    generation_input: dict[str, Any],
    api_url: str,
    *,
    api_key_required: bool,
    stream: bool = True,
    adapter_sha256: str | None = None,
) -> str:
    """httpx code: streamed (server-sent events, printed as they come) or one JSON answer."""
    body = {"input": generation_input, "stream": stream}
    imports = "import os\n\nimport httpx" if api_key_required else "import httpx"
    imports = adapter_comment(generation_input, adapter_sha256) + imports
    auth = (
        '    headers={"Authorization": f"Bearer {os.environ[\'API_KEY\']}"},\n'
        if api_key_required
        else ""
    )
    url = json.dumps(api_url + "/v1/predictions")
    if not stream:
        return (
            f"{imports}\n\nresponse = httpx.post(\n    {url},\n"
            f"    json={python_literal(body, 4)},\n{auth}    timeout=300,\n)\n"
            'response.raise_for_status()\nprint(response.json()["output"])\n'
        )
    return (
        f"{imports}\n\n"
        "# Server-sent events: `output` pieces of the answer, then `done` (the prediction).\n"
        "with httpx.stream(\n"
        '    "POST",\n'
        f"    {url},\n"
        f"    json={python_literal(body, 4)},\n"
        f"{auth}"
        "    timeout=300,\n"
        ") as response:\n"
        "    response.raise_for_status()\n"
        '    print("permalink:", response.headers["link"])\n'
        "    event = None\n"
        "    for line in response.iter_lines():\n"
        '        if line.startswith("event: "):\n'
        '            event = line.removeprefix("event: ")\n'
        '        elif line.startswith("data: ") and event == "output":\n'
        '            print(line.removeprefix("data: "), end="", flush=True)\n'
    )


def openai(
    generation_input: dict[str, Any],
    api_url: str,
    *,
    api_key_required: bool,
    adapter_sha256: str | None = None,
) -> str:
    arguments: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for name, value in generation_input.items():
        if name in _OPENAI_ARGUMENTS:
            arguments[_OPENAI_ARGUMENTS[name]] = value
        elif name in _OPENAI_EXTRAS:
            extras[_OPENAI_EXTRAS[name]] = value
    guide = _openai_guide(generation_input.get("guided_decoding"))
    if guide is not None:
        (arguments if guide[0] == "response_format" else extras)[guide[0]] = guide[1]
    chat = "messages" in generation_input
    if chat:
        call, text = "client.chat.completions.create", "chunk.choices[0].delta.content or ''"
        head = f"    messages={python_literal(generation_input['messages'], 4)},\n"
    else:
        call, text = "client.completions.create", "chunk.choices[0].text"
        head = f"    prompt={python_literal(generation_input.get('prompt', ''), 4)},\n"
    lines = [f"    {key}={python_literal(value, 4)},\n" for key, value in arguments.items()]
    if extras:  # TritonBox's own parameters, which the SDK passes through as extra_body
        lines.append(f"    extra_body={python_literal(extras, 4)},\n")
    key = 'os.environ["API_KEY"]' if api_key_required else '"not needed"'
    imports = (
        "import os\n\nfrom openai import OpenAI"
        if api_key_required
        else "from openai import OpenAI"
    )
    # An adapter is a model of its own on the OpenAI routes; the base is the first one listed.
    adapter = generation_input.get("adapter")
    model = (
        f"model = {json.dumps(adapter)}  # a LoRA adapter of the base model\n"
        if adapter
        else "model = client.models.list().data[0].id\n"
    )
    return (
        f"{adapter_comment(generation_input, adapter_sha256)}{imports}\n\n"
        f"client = OpenAI(base_url={json.dumps(api_url + '/v1')}, api_key={key})\n"
        f"{model}"
        f"stream = {call}(\n"
        "    model=model,\n"
        f"{head}{''.join(lines)}"
        "    stream=True,\n"
        ")\n"
        "for chunk in stream:\n"
        f"    print({text}, end='', flush=True)\n"
    )
