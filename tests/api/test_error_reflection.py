"""Errors say what is wrong without reflecting a large input back, and a body FastAPI cannot
parse (lists nested past the parser's recursion limit, bytes that are not UTF-8) is a 400
naming the body and why, not FastAPI's "There was an error parsing the body". The abuse suite
(tests/abuse) found both; here on a small app with the api's error handlers."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from tritonbox_api.errors import install_error_handlers, shown


class Body(BaseModel):
    prompt: str = Field(max_length=100)
    messages: list[object] = []


def _client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/echo")
    async def echo(body: Body) -> dict[str, str]:
        return {"prompt": body.prompt}

    return TestClient(app)


def test_a_long_value_is_named_by_its_start_and_length_not_repeated() -> None:
    assert shown("short") == "'short'"
    assert shown("a" * 200_000) == f"{'a' * 32!r}… (200000 characters)"
    assert shown(list(range(100))) == "…"
    answer = _client().post("/echo", json={"prompt": "b" * 500_000})
    assert answer.status_code == 422
    assert len(answer.content) < 500
    start = repr("b" * 32)
    expected = (
        f"prompt: string should have at most 100 characters, got {start}… (500000 characters)"
    )
    assert answer.json()["error"]["message"] == expected


def test_an_unparsable_body_is_a_400_naming_the_body_and_why() -> None:
    client = _client()
    headers = {"content-type": "application/json"}
    deep = b'{"prompt": "x", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for content, why in ((deep, "nested too deeply to read"), (b'{"prompt": "\xff"}', "not UTF-8")):
        answer = client.post("/echo", content=content, headers=headers)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == "body"
        assert error["message"] == f"body: not valid JSON ({why})"
    # What FastAPI itself takes for malformed JSON keeps its own answer.
    broken = client.post("/echo", content=b'{"prompt": ', headers=headers)
    assert broken.json()["error"]["message"].startswith("body: not valid JSON (Expecting value")
