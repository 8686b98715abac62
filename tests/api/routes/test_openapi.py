"""The OpenAPI document tells the truth: each route lists the statuses it can answer, with the
body and media types it answers them with, and what the live api answers is declared there."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.routing import RouteContext
from prometheus_client import CONTENT_TYPE_LATEST

from tritonbox_api.deps import require_api_key, require_manage
from tritonbox_api.main import create_app
from tritonbox_api.protocol.openai import MAX_PROMPT_CHOICES
from tritonbox_api.routes.responses import api_routes
from tritonbox_api.settings import ApiSettings

APP = create_app(ApiSettings(_env_file=None))  # type: ignore[call-arg]
DOCUMENT = APP.openapi()
JSON, SSE, TEXT, HTML = "application/json", "text/event-stream", "text/plain", "text/html"
ERROR = "#/components/schemas/ErrorResponse"

GENERATING = {"401", "404", "409", "413", "429", "503"}
OPENAI = GENERATING | {"400", "499", "502"}
NATIVE = GENERATING | {"400", "422"}
# (method, path): ({status: media types} of the answers that are not errors, the error statuses:
# each with OpenAI's error body as JSON).
EXPECTED: dict[tuple[str, str], tuple[dict[str, set[str]], set[str]]] = {
    ("GET", "/healthz"): ({"200": {JSON}}, set()),
    ("GET", "/readyz"): ({"200": {JSON}, "503": {JSON}}, set()),
    ("GET", "/metrics"): ({"200": {CONTENT_TYPE_LATEST}}, set()),
    ("POST", "/predict"): ({"200": {JSON, TEXT}}, NATIVE),
    ("POST", "/v1/predictions"): ({"201": {JSON}, "200": {SSE}}, NATIVE),
    ("GET", "/v1/predictions"): ({"200": {JSON}}, {"401", "422"}),
    ("GET", "/v1/predictions/{prediction_id}"): ({"200": {JSON}}, {"404"}),
    ("POST", "/v1/predictions/{prediction_id}/cancel"): ({"200": {JSON}}, {"401", "404"}),
    ("GET", "/v1/limits"): ({"200": {JSON}}, {"401", "503"}),
    ("POST", "/v1/completions"): ({"200": {JSON, SSE}}, OPENAI),
    ("POST", "/v1/chat/completions"): ({"200": {JSON, SSE}}, OPENAI),
    ("GET", "/v1/models"): ({"200": {JSON}}, {"401", "503"}),
    ("GET", "/v1/models/{model_id}"): ({"200": {JSON}}, {"401", "404", "503"}),
    ("POST", "/v1/adapters"): (
        {"201": {JSON}},
        {"400", "401", "403", "409", "413", "422", "503"},
    ),
    ("GET", "/v1/adapters"): ({"200": {JSON}}, {"401"}),
    ("GET", "/v1/adapters/{name}"): ({"200": {JSON}}, {"401", "404", "422"}),
    ("DELETE", "/v1/adapters/{name}"): ({"200": {JSON}}, {"401", "403", "404", "422"}),
    ("GET", "/p/{prediction_id}"): ({"200": {HTML}, "404": {HTML}}, set()),
    ("POST", "/v1/files"): ({"200": {JSON}}, {"400", "401", "413", "429"}),
    ("GET", "/v1/files"): ({"200": {JSON}}, {"400", "401"}),
    ("GET", "/v1/files/{file_id}"): ({"200": {JSON}}, {"401", "404"}),
    ("GET", "/v1/files/{file_id}/content"): ({"200": {"application/jsonl"}}, {"401", "404"}),
    ("DELETE", "/v1/files/{file_id}"): ({"200": {JSON}}, {"401", "404"}),
    ("POST", "/v1/batches"): ({"200": {JSON}}, {"400", "401", "404", "413", "429"}),
    ("GET", "/v1/batches"): ({"200": {JSON}}, {"400", "401"}),
    ("GET", "/v1/batches/{batch_id}"): ({"200": {JSON}}, {"401", "404"}),
    ("POST", "/v1/batches/{batch_id}/cancel"): ({"200": {JSON}}, {"401", "404"}),
}


def _operations() -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): operation
        for path, operations in DOCUMENT["paths"].items()
        for method, operation in operations.items()
    }


def test_every_route_is_expected() -> None:
    assert set(_operations()) == set(EXPECTED)


@pytest.mark.parametrize(("method", "path"), sorted(EXPECTED))
def test_each_route_declares_what_it_answers(method: str, path: str) -> None:
    responses = _operations()[(method, path)]["responses"]
    answers, errors = EXPECTED[(method, path)]
    assert set(responses) == set(answers) | errors, (method, path)
    for status, media_types in answers.items():
        assert set(responses[status]["content"]) == media_types, (method, path, status)
    for status in errors:  # OpenAI's error body, as JSON
        content = responses[status]["content"]
        assert set(content) == {JSON}, (method, path, status)
        assert content[JSON]["schema"]["$ref"] == ERROR, (method, path, status)
    for status in ("429", "503"):
        if status in responses:
            assert "Retry-After" in responses[status]["headers"]


def test_fastapis_validation_body_is_nowhere() -> None:
    # The api never answers FastAPI's HTTPValidationError: its 422 is OpenAI's error body.
    assert "HTTPValidationError" not in str(DOCUMENT)
    assert "ValidationError" not in DOCUMENT["components"]["schemas"]


def test_rules_the_schema_can_state_are_in_it() -> None:
    schemas = DOCUMENT["components"]["schemas"]
    # seed's bound exactly (FastAPI's float rounds 2**63 - 1 up to 2**63), integers as integers.
    for name in ("GenerationInput", "CompletionRequest", "ChatCompletionRequest"):
        seed = schemas[name]["properties"]["seed"]["anyOf"][0]
        assert seed == {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
    # Exactly one of prompt and messages, on /predict and in /v1/predictions' input.
    for name in ("GenerationInput", "PredictRequest"):
        branches = schemas[name]["anyOf"]
        assert [branch["required"] for branch in branches] == [["prompt"], ["messages"]]
    # Completions' four prompt forms (OpenAI's): text, token ids, and bounded lists of either.
    forms = schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"]
    assert [form["type"] for form in forms] == ["string", "array", "array", "array"]
    assert forms[1]["items"] == {"type": "integer", "minimum": 0}
    for listed in forms[2:]:
        assert (listed["minItems"], listed["maxItems"]) == (1, MAX_PROMPT_CHOICES)


def _guarded(route: RouteContext) -> bool:
    return any(d.call is require_api_key for d in route.dependant.dependencies)


def test_401_is_declared_exactly_where_the_key_is_checked() -> None:
    operations = _operations()
    routes = list(api_routes(APP))
    assert sum(map(_guarded, routes)) >= 10  # the walk sees the guard
    for route in routes:
        for method in route.methods or ():
            path = str(route.path_format)
            declared = "401" in operations[(method, path)]["responses"]
            assert declared == _guarded(route), (method, path)
            # 403, the role a key lacks, exactly where the manage role is checked.
            managed = any(d.call is require_manage for d in route.dependant.dependencies)
            assert ("403" in operations[(method, path)]["responses"]) == managed, (method, path)


def _declared(method: str, path: str, answer: httpx.Response) -> None:
    """`answer`'s status and media type are in the document's entry for (method, path)."""
    responses = _operations()[(method, path)]["responses"]
    status = str(answer.status_code)
    assert status in responses, (method, path, status, answer.text[:200])
    media_type = answer.headers["content-type"].split(";")[0]
    declared = {m.split(";")[0] for m in responses[status].get("content", {})}
    assert media_type in declared, (method, path, status, media_type)


def test_what_the_api_answers_is_declared(api: httpx.Client) -> None:
    model = api.get("/v1/models").json()["data"][0]["id"]
    short = {"max_tokens": 2, "temperature": 0}
    calls: list[tuple[str, str, str, dict[str, Any]]] = [
        ("GET", "/healthz", "/healthz", {}),
        ("GET", "/readyz", "/readyz", {}),
        ("GET", "/metrics", "/metrics", {}),
        ("GET", "/v1/limits", "/v1/limits", {}),
        ("GET", "/v1/models/{model_id}", "/v1/models/nope", {}),
        ("GET", "/v1/predictions", "/v1/predictions?limit=0", {}),
        ("GET", "/v1/predictions/{prediction_id}", "/v1/predictions/nope", {}),
        ("GET", "/p/{prediction_id}", "/p/nope", {}),
        ("GET", "/v1/adapters/{name}", "/v1/adapters/no%20such", {}),
        ("POST", "/predict", "/predict", {"json": {"prompt": "Hi", **short}}),
        ("POST", "/predict", "/predict", {"json": {"prompt": ""}}),
        ("POST", "/predict", "/predict", {"json": {"prompt": "x" * 2_000_000}}),
        ("POST", "/predict", "/predict", {"json": {"prompt": "Hi", "adapter": "nope"}}),
        ("POST", "/v1/predictions", "/v1/predictions", {"json": {"input": {}, "extra": 1}}),
        (
            "POST",
            "/v1/predictions",
            "/v1/predictions",
            {"json": {"input": {"prompt": "Hi", **short}}},
        ),
        ("POST", "/v1/completions", "/v1/completions", {"json": {"model": model, "prompt": 3}}),
        ("POST", "/v1/completions", "/v1/completions", {"json": {"model": "x", "prompt": "Hi"}}),
    ]
    answered: set[int] = set()
    for method, path, url, options in calls:
        answer = api.request(method, url, **options)
        _declared(method, path, answer)
        answered.add(answer.status_code)
    stream = {"model": model, "prompt": "Hi", "stream": True, **short}
    with api.stream("POST", "/v1/completions", json=stream) as answer:
        _declared("POST", "/v1/completions", answer)
        answered.add(answer.status_code)
    made = api.post("/v1/predictions", json={"input": {"prompt": "Hi", **short}, "stream": True})
    _declared("POST", "/v1/predictions", made)
    answered.add(made.status_code)
    prediction = made.headers["x-prediction-id"]
    cancel = f"/v1/predictions/{prediction}/cancel"
    _declared("POST", "/v1/predictions/{prediction_id}/cancel", api.post(cancel))
    page = api.get(f"/p/{prediction}")
    _declared("GET", "/p/{prediction_id}", page)
    answered.add(page.status_code)
    # Not vacuous: successes, refusals of both kinds, missing things and a body too large.
    assert answered >= {200, 201, 400, 404, 413, 422}
