"""Who may call what, enumerated from the app itself: a route added later is checked too.

With API_KEY set, every route answers 401 without the key and with a wrong one, except the
routes listed in PUBLIC on purpose: probes (health, readiness, Prometheus), the OpenAPI schema
pages (no data), and reading one prediction by its id (a permalink is a capability: 192 random
bits; whoever holds the link may read that prediction, never list others). Among the keys, a
`use` key may call every guarded route but those that manage (MANAGE: 403 naming the role it
lacks), and each prediction's row and the metrics name the key that asked.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
import pytest
from starlette.routing import Route
from tritonbox_testing.api_process import RunningApi, launch_api

from tritonbox_api.main import create_app
from tritonbox_api.settings import ApiSettings

pytestmark = pytest.mark.server

KEY = "s3cret-key-for-tests"  # API_KEY: the key `default`, both roles
USE_KEY, OPS_KEY = "alices-use-key", "ops-manage-key"
KEYS = f"alice:use:{USE_KEY},ops:manage:sha256:{hashlib.sha256(OPS_KEY.encode()).hexdigest()}"
MANAGE = {("POST", "/v1/adapters"), ("DELETE", "/v1/adapters/{name}")}
PUBLIC = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
    ("GET", "/p/{prediction_id}"),
    ("GET", "/v1/predictions/{prediction_id}"),
}


APP = create_app(ApiSettings(_env_file=None))  # type: ignore[call-arg]


def _walk(routes: Iterable[Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    for route in routes:
        # FastAPI keeps an included router as a wrapper around the original (with its prefix).
        if hasattr(route, "original_router"):
            yield from _walk(route.original_router.routes, prefix + route.include_context.prefix)
        elif isinstance(route, Route):
            yield from ((m, prefix + route.path) for m in route.methods or () if m != "HEAD")


def app_routes() -> set[tuple[str, str]]:
    """Every (method, path) the api serves, from the same factory the server runs."""
    return set(_walk(APP.routes))


ROUTES = sorted(app_routes())
# HEAD is answered wherever GET is (HeadMiddleware): it must be guarded exactly like the GET.
HEADS = sorted(("HEAD", path) for method, path in ROUTES if method == "GET")
PUBLIC_HEADS = {("HEAD", path) for method, path in PUBLIC}


def test_the_enumeration_sees_every_kind_of_route() -> None:
    # Guard against a vacuous pass: the generating routes and the public list are all there.
    assert {
        ("POST", "/predict"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/predictions"),
    } <= set(ROUTES)
    assert set(ROUTES) >= PUBLIC, "a public route was removed: update PUBLIC"
    documented = {(m.upper(), path) for path, ops in APP.openapi()["paths"].items() for m in ops}
    assert documented <= set(ROUTES), "the walk missed routes the OpenAPI schema lists"


def _call(url: str, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    concrete = path.replace("{prediction_id}", "p" * 32)
    body: dict[str, Any] | None = {} if method == "POST" else None
    return httpx.request(method, url + concrete, json=body, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def keyed_api(triton_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    running = launch_api(
        triton_server, tmp_path_factory.mktemp("keyed"), api_key=KEY, api_keys=KEYS
    )
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize(
    ("method", "path"), [r for r in ROUTES + HEADS if r not in PUBLIC | PUBLIC_HEADS]
)
def test_a_guarded_route_refuses_a_missing_or_wrong_key(
    keyed_api: RunningApi, method: str, path: str
) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        answer = _call(keyed_api.url, method, path, headers)
        assert answer.status_code == 401, (method, path, headers, answer.text[:200])
        assert answer.headers["www-authenticate"] == "Bearer"
        assert KEY not in answer.text


@pytest.mark.parametrize(("method", "path"), sorted(PUBLIC | PUBLIC_HEADS))
def test_a_public_route_answers_without_a_key(
    keyed_api: RunningApi, method: str, path: str
) -> None:
    answer = _call(keyed_api.url, method, path, {})
    assert answer.status_code != 401, (method, path)
    assert method != "HEAD" or answer.content == b""


def test_a_permalink_reads_one_prediction_and_lists_nothing(keyed_api: RunningApi) -> None:
    url, auth = keyed_api.url, {"Authorization": f"Bearer {KEY}"}
    body = {"input": {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}}
    made = httpx.post(f"{url}/v1/predictions", json=body, headers=auth, timeout=120)
    assert made.status_code == 201
    prediction_id = made.json()["id"]
    # Without the key: that one prediction, as JSON and as the page …
    read = httpx.get(f"{url}/v1/predictions/{prediction_id}", timeout=30)
    assert read.status_code == 200 and read.json()["id"] == prediction_id
    page = httpx.get(f"{url}/p/{prediction_id}", timeout=30)
    assert page.status_code == 200 and "The capital of France is" in page.text
    # … but neither the list, nor a cancel, nor anything the page links to that lists others.
    assert httpx.get(f"{url}/v1/predictions", timeout=30).status_code == 401
    assert httpx.post(f"{url}/v1/predictions/{prediction_id}/cancel", timeout=30).status_code == 401
    assert "/v1/predictions?" not in page.text
    # The key reaches no response, log or row.
    assert KEY not in read.text + page.text + made.text
    assert KEY not in keyed_api.log_path.read_text()
    with sqlite3.connect(keyed_api.database_path) as connection:
        assert KEY not in "\n".join(connection.iterdump())


GUARDED_ROUTES = [r for r in ROUTES if r not in PUBLIC]


def test_the_manage_routes_are_all_there() -> None:
    assert set(ROUTES) >= MANAGE


@pytest.mark.parametrize(("method", "path"), GUARDED_ROUTES)
def test_a_use_key_may_use_but_not_manage(keyed_api: RunningApi, method: str, path: str) -> None:
    answer = _call(keyed_api.url, method, path, {"Authorization": f"Bearer {USE_KEY}"})
    if (method, path) in MANAGE:
        assert answer.status_code == 403, answer.text
        error = answer.json()["error"]
        assert error["type"] == "permission_error"
        assert "the key alice lacks the manage role" in error["message"]
    else:
        assert answer.status_code not in (401, 403), (method, path, answer.text[:200])
    assert USE_KEY not in answer.text


@pytest.mark.parametrize("key", [KEY, OPS_KEY])
def test_a_manage_key_and_the_single_api_key_may_manage(keyed_api: RunningApi, key: str) -> None:
    for method, path in sorted(MANAGE):
        answer = _call(keyed_api.url, method, path, {"Authorization": f"Bearer {key}"})
        assert answer.status_code == 422, (method, path, answer.text)  # past the key: the body


def test_the_key_name_is_on_the_row_and_in_the_metrics(keyed_api: RunningApi) -> None:
    body = {"input": {"prompt": "Hi", "max_tokens": 2, "temperature": 0}}
    made = {}
    for name, key in (("alice", USE_KEY), ("default", KEY), ("ops", OPS_KEY)):
        answer = httpx.post(f"{keyed_api.url}/v1/predictions", json=body,
                            headers={"Authorization": f"Bearer {key}"}, timeout=120)  # fmt: skip
        assert answer.status_code == 201, answer.text
        made[answer.json()["id"]] = name
    with sqlite3.connect(keyed_api.database_path) as connection:
        rows = dict(connection.execute("SELECT id, api_key_name FROM prediction").fetchall())
    assert {i: rows[i] for i in made} == made
    metrics = httpx.get(f"{keyed_api.url}/metrics", timeout=30).text
    for name in made.values():
        assert f'key="{name}"' in metrics, name
    assert USE_KEY not in metrics and OPS_KEY not in metrics
