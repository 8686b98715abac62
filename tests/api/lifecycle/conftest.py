"""The real app in-process, in front of a fake engine whose work can be watched.

`FakeEngine` stands in for the Triton gateway: it streams real token ids at a set pace, counts
the requests it is working on (`active`, the in-process twin of TensorRT-LLM's active-request
metric) and forgets one only when it ends on its own or its `stop` arrives, as the real engine
does when the api's gRPC stream is merely cancelled. `call` drives the app as uvicorn does: the
body, then `receive` blocks until the client disconnects (then says so to every reader), and
writes after the disconnect are dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from tritonbox_api import main
from tritonbox_api.main import create_app
from tritonbox_api.settings import ApiSettings
from tritonbox_api.triton_gateway import EngineInfo, TritonUnavailableError
from tritonbox_common.client import Chunk, GenerationRequest, TritonRequestError
from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.settings import DEFAULT_MODEL_NAME

REPO = Path(__file__).resolve().parents[3]

TEXT = " Paris.\n\nThe answer is: Paris, the capital of France, on the Seine."


class FakeEngine:
    def __init__(self, tokenizer_dir: Path, *, max_output_len: int = 512) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.max_output_len = max_output_len
        self.ids: list[int] = []  # set by the fixture once the tokenizer is loaded
        self.interval_s = 0.01  # between tokens
        self.queued_s = 0.0  # before the first token (waiting in the engine's queue)
        self.stop_delay_s = 0.0
        self.down = False
        self.refuse: str | None = None  # an error the engine answers every request with
        self.active: set[str] = set()
        self.started: list[GenerationRequest] = []
        self.stops: list[str] = []

    # The TritonGateway interface the api uses.
    def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def is_ready(self) -> bool:
        return not self.down

    async def engine_info(self) -> EngineInfo:
        if self.down:
            raise TritonUnavailableError("fake engine down")
        return EngineInfo(self.tokenizer_dir, 512, self.max_output_len)

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        if self.down:
            raise TritonUnavailableError("fake engine down")
        self.started.append(request)
        if self.refuse is not None:
            raise TritonRequestError(self.refuse)
        self.active.add(request.request_id)
        await asyncio.sleep(self.queued_s)
        tokens = itertools.islice(itertools.cycle(self.ids), request.max_tokens)
        for token in tokens:
            if request.request_id not in self.active:
                return  # stopped: the real engine sends an error, the stream is gone by then
            yield Chunk(ids=[token], final=False)
            await asyncio.sleep(self.interval_s)
        self.active.discard(request.request_id)
        yield Chunk(ids=[], final=True)

    async def stop_request(self, request_id: str, *, timeout_s: float) -> bool:
        self.stops.append(request_id)
        await asyncio.sleep(self.stop_delay_s)
        self.active.discard(request_id)
        return True

    async def idle_within(self, seconds: float) -> float:
        """How long until no request is active; fails after `seconds`."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        while self.active:
            assert loop.time() - start < seconds, f"engine still busy: {self.active}"
            await asyncio.sleep(0.005)
        return loop.time() - start


@dataclass
class Exchange:
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)
    complete: asyncio.Event = field(default_factory=asyncio.Event)
    disconnect: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def json(self) -> Any:
        return json.loads(self.body)

    async def wait_chunks(self, count: int, timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while len([c for c in self.chunks if c]) < count and not self.complete.is_set():
                await asyncio.sleep(0.005)

    async def finish(self, timeout_s: float = 10.0) -> Exchange:
        assert self.task is not None
        async with asyncio.timeout(timeout_s):
            await self.task
        return self


Caller = Callable[..., AsyncIterator[Exchange]]


def call(
    app: FastAPI,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    chunked: bool = False,
) -> Exchange:
    """Start one request; `exchange.disconnect.set()` is the client leaving. `chunked`: the body
    comes in 1 KiB pieces without a Content-Length."""
    data = b"" if body is None else json.dumps(body).encode()
    raw_headers = [(b"content-type", b"application/json")]
    if not chunked:
        raw_headers.append((b"content-length", b"%d" % len(data)))
    pieces = [data[i : i + 1024] for i in range(0, len(data), 1024)] if chunked else [data]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    path, _, query = path.partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
        "query_string": query.encode(), "root_path": "", "headers": raw_headers,
        "client": ("127.0.0.1", 50000), "server": ("testserver", 80), "state": {},
    }  # fmt: skip
    exchange = Exchange()
    unsent = list(pieces) or [b""]

    async def receive() -> dict[str, Any]:
        if unsent:
            piece = unsent.pop(0)
            return {"type": "http.request", "body": piece, "more_body": bool(unsent)}
        await exchange.disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if exchange.disconnect.is_set():
            return  # uvicorn drops writes to a gone client
        if message["type"] == "http.response.start":
            exchange.status = message["status"]
            exchange.headers = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            exchange.chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                exchange.complete.set()
                exchange.disconnect.set()  # uvicorn: receive() says disconnect once complete

    exchange.task = asyncio.create_task(app(scope, receive, send))  # type: ignore[arg-type]
    return exchange


@dataclass
class Stack:
    app: FastAPI
    engine: FakeEngine
    settings: ApiSettings

    @property
    def services(self) -> Any:
        return self.app.state.services

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Exchange:
        return call(self.app, method, path, body, **kw)

    async def row(self, prediction_id: str) -> Any:
        from tritonbox_api.db import crud

        return await self.services.database.read(
            lambda session: crud.get_prediction(session=session, id=prediction_id)
        )


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    return prepare_default_model(REPO / ".cache" / "models" / DEFAULT_MODEL_NAME)


@pytest.fixture
def make_stack(
    database_url: str, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Any]:
    """`async with make_stack(**settings) as stack`: the app started, with its fake engine, on
    SQLite and on PostgreSQL (`database_url`)."""

    @asynccontextmanager
    async def make(**settings: Any) -> AsyncIterator[Stack]:
        engine = FakeEngine(tokenizer_dir, max_output_len=settings.pop("max_output_len", 512))
        monkeypatch.setattr(main, "TritonGateway", lambda *a, **k: engine)
        values = {"database_url": database_url, "model_name": "fake-model", **settings}
        factory: Any = ApiSettings  # `_env_file=None`: tests ignore a developer's .env
        app = create_app(factory(_env_file=None, **values))
        async with app.router.lifespan_context(app):
            context = await app.state.services.engine_context.get()
            engine.ids = [int(i) for i in context.tokenizer.encode(TEXT, add_special_tokens=False)]
            yield Stack(app=app, engine=engine, settings=app.state.services.settings)

    return make
