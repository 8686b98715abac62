"""What each hostile case sends: plain httpx, as an attacker holding a key would.

Each function takes the attacker's client (the api's base URL, no key) and the target, and
returns the answers it got."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
from tritonbox_testing.abuse import stack
from tritonbox_testing.abuse.adapters import HostileAdapters

Send = Callable[[httpx.Client, "Target"], list[httpx.Response]]


@dataclass(frozen=True)
class Target:
    url: str
    model: str
    max_input_len: int
    adapters: HostileAdapters


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.secret(name)}"}


def _chat(target: Target, **fields: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Hello"}]
    return {"model": target.model, "messages": messages, "max_tokens": 8} | fields


def _complete(target: Target, **fields: Any) -> dict[str, Any]:
    return {"model": target.model, "prompt": "Hello", "max_tokens": 8} | fields


def chat(key: str = "intruder", **fields: Any) -> Send:
    """One chat completion with these fields, from `key`."""

    def send(client: httpx.Client, target: Target) -> list[httpx.Response]:
        body = _chat(target, **fields)
        return [client.post("/v1/chat/completions", json=body, headers=auth(key))]

    return send


def complete(key: str = "intruder", **fields: Any) -> Send:
    def send(client: httpx.Client, target: Target) -> list[httpx.Response]:
        body = _complete(target, **fields)
        return [client.post("/v1/completions", json=body, headers=auth(key))]

    return send


def at_once(send: Send, count: int, workers: int) -> Send:
    """`count` of `send`, `workers` at a time (a burst, a flood)."""

    def burst(client: httpx.Client, target: Target) -> list[httpx.Response]:
        with ThreadPoolExecutor(workers) as pool:
            answers = pool.map(lambda _: send(client, target), range(count))
            return [answer for some in answers for answer in some]

    return burst


def holding_a_slot(send: Send, key: str = "intruder", tries: int = 3) -> Send:
    """`send` while a stream of `key`'s holds a slot: the api's slots are never all free then
    (alone, a prediction runs whatever its `n`), whatever the interactive streams are doing.

    The stream is read on after `send` is answered: a stream that had already ended (an error
    chunk or `[DONE]`) held no slot, so its answer proves nothing and the probe is made again;
    RuntimeError, with what the stream said, when it ends early `tries` times."""

    def held(client: httpx.Client, target: Target) -> list[httpx.Response]:
        seen: list[str] = []
        for _ in range(tries):
            # ignore_eos: a sampled "Hello" may end in a few tokens, freeing the slot too soon
            body = _complete(target, max_tokens=256, stream=True, ignore_eos=True)
            with client.stream("POST", "/v1/completions", json=body, headers=auth(key)) as stream:
                stream.raise_for_status()
                lines = (line for line in stream.iter_lines() if line.startswith("data:"))
                first = next(lines)
                answers = send(client, target)
                after = next(lines, "")  # leaving the block then disconnects: the engine stops
            if _streaming(first) and _streaming(after):
                return answers
            seen.append(f"{first[:300]!r} then {after[:300]!r}")
        raise RuntimeError(f"the stream meant to hold a slot ended early: {seen}")

    return held


def _streaming(line: str) -> bool:
    """Whether an OpenAI stream's `data:` line is a chunk of text (not an error, not the end)."""
    return line.startswith('data: {"id"') and '"choices"' in line


def raw(path: str, content: bytes | Callable[[], Iterator[bytes]], key: str = "intruder") -> Send:
    """A POST of these bytes as JSON (a function of them: sent chunked, no Content-Length)."""

    def send(client: httpx.Client, target: Target) -> list[httpx.Response]:
        headers = auth(key) | {"content-type": "application/json"}
        body = content() if callable(content) else content
        return [client.post(path, content=body, headers=headers)]

    return send


def deep_json(levels: int) -> bytes:
    """A small body whose lists nest `levels` deep: a recursive parser's stack, not its size."""
    return b'{"model": "m", "messages": ' + b"[" * levels + b"]" * levels + b"}"


def large_json(size: int) -> bytes:
    return json.dumps({"model": "m", "prompt": "a" * size}).encode()


def chunks(size: int) -> Callable[[], Iterator[bytes]]:
    def pieces() -> Iterator[bytes]:
        body = large_json(size)
        for at in range(0, len(body), 65_536):
            yield body[at : at + 65_536]

    return pieces


def upload(size: int) -> Send:
    def send(client: httpx.Client, target: Target) -> list[httpx.Response]:
        line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/completions",
                           "body": _complete(target)}).encode() + b"\n"  # fmt: skip
        content = line * (size // len(line) + 1)
        files = {"file": ("in.jsonl", content, "application/jsonl")}
        return [client.post("/v1/files", files=files, data={"purpose": "batch"},
                            headers=auth("intruder"))]  # fmt: skip

    return send


def register(sources: Callable[[HostileAdapters], list[str]], key: str = "admin",
             name: str | None = None) -> Send:  # fmt: skip
    """POST /v1/adapters of each source `sources` names, as adapter `name` (default: x)."""

    def send(client: httpx.Client, target: Target) -> list[httpx.Response]:
        return [
            client.post(
                "/v1/adapters",
                json={"name": name or "x", "source": source},
                headers=auth(key),
            )
            for source in sources(target.adapters)
        ]

    return send


def base_name(client: httpx.Client, target: Target) -> list[httpx.Response]:
    body = {"name": target.model, "source": "negative-shape"}
    return [client.post("/v1/adapters", json=body, headers=auth("admin"))]


def manage_with_use_key(client: httpx.Client, target: Target) -> list[httpx.Response]:
    body = {"name": "mine", "source": "negative-shape"}
    return [
        client.post("/v1/adapters", json=body, headers=auth("intruder")),
        client.delete("/v1/adapters/mine", headers=auth("intruder")),
    ]


def wrong_key(client: httpx.Client, target: Target) -> list[httpx.Response]:
    headers = {"Authorization": "Bearer people-key-guessed"}
    return [client.post("/v1/chat/completions", json=_chat(target), headers=headers)]


def page_size(client: httpx.Client, target: Target) -> list[httpx.Response]:
    return [client.get("/v1/predictions", params={"limit": 10**9}, headers=auth("intruder"))]


def many_messages(count: int, content: str) -> Send:
    """A chat of `count` messages of `content`: the template's and the tokenizer's work."""

    def send(client: httpx.Client, target: Target) -> list[httpx.Response]:
        messages = [{"role": "user", "content": content}] * count
        body = _chat(target, messages=messages)
        return [client.post("/v1/chat/completions", json=body, headers=auth("intruder"))]

    return send


def long_prompt(target_tokens_over: float) -> Send:
    """A prompt of words, `target_tokens_over` times the engine's MAX_INPUT_LEN in tokens."""

    def send(client: httpx.Client, target: Target) -> list[httpx.Response]:
        prompt = " hello" * int(target.max_input_len * target_tokens_over)
        body = _complete(target, prompt=prompt)
        return [client.post("/v1/completions", json=body, headers=auth("intruder"))]

    return send


def both(*sends: Send) -> Send:
    def send(client: httpx.Client, target: Target) -> list[httpx.Response]:
        return [answer for one in sends for answer in one(client, target)]

    return send


def nested_schema(levels: int) -> dict[str, Any]:
    """A JSON schema `levels` objects deep (two JSON levels each)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def echo_prompt(tokens: Callable[[Target], int]) -> Send:
    """Completions' `echo` with `logprobs` of a prompt of `tokens(target)` tokens, generating
    nothing: the prompt's log-probs at every position."""

    def send(client: httpx.Client, target: Target) -> list[httpx.Response]:
        prompt = " hello" * tokens(target)
        body = _complete(target, prompt=prompt, echo=True, logprobs=5, max_tokens=0)
        return [client.post("/v1/completions", json=body, headers=auth("intruder"))]

    return send


def slow_schema(strings: int) -> Send:
    """A chat guided by a JSON schema of `strings` strings, each with its own maxLength of about
    1,000: xgrammar compiles each such string in about 1.5 s of a core (16: 26 s on the 2-core
    test machine), and a schema sent again is compiled once. Each send is a new schema, so each
    is a compilation of its own: the engine's time limit and its bound on compilations at once
    (engine/guide_pool.py) are what is met."""
    sent = itertools.count()

    def send(client: httpx.Client, target: Target) -> list[httpx.Response]:
        first = 1000 + strings * next(sent)
        properties = {f"s{i}": {"type": "string", "maxLength": first + i} for i in range(strings)}
        schema = {"type": "object", "properties": properties, "required": [*properties]}
        return chat(guided_json=schema)(client, target)

    return send
