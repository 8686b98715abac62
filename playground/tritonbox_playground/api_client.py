"""The playground's only way to the model: the api, over HTTP (so every run is a logged
prediction with source=playground). Failures become a PlaygroundError whose message is meant
for the person in front of the page: the api's own message when it gave one."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from tritonbox_playground.sse import server_sent_events


class PlaygroundError(Exception):
    """Something the user should read: what went wrong, in plain words."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code


class AdapterRef(BaseModel):
    """Which adapter produced a prediction: its name and the sha256 of its files."""

    model_config = ConfigDict(extra="ignore")

    name: str
    sha256: str = ""


class PredictionView(BaseModel):
    """The part of the api's prediction object the playground shows."""

    model_config = ConfigDict(extra="ignore")

    id: str
    status: str
    source: str = "api"
    input: dict[str, Any] = {}
    applied: dict[str, Any] = {}
    output: str = ""
    error: str | None = None
    finish_reason: str | None = None
    stop_word: str | None = None  # which stop word ended it (none on rows from before 0.2)
    metrics: dict[str, float | int | None] = {}
    urls: dict[str, str] = {}
    created_at: str | None = None
    adapter: AdapterRef | None = None  # None: the base model (and every row from before 0.3)


class AdapterInfo(BaseModel):
    """One adapter of the api's GET /v1/adapters (the part the page shows)."""

    model_config = ConfigDict(extra="ignore")

    name: str
    sha256: str = ""
    rank: int | None = None
    source: str = ""


# GET /v1/adapters answers these when adapters are turned off (MAX_LORA_RANK=0: 501) or the api
# predates them (404): the page then offers the base model only, and says so.
ADAPTERS_OFF = (404, 501)


class EngineLimits(BaseModel):
    """The api's GET /v1/limits: what this engine accepts, as numbers to show people."""

    model_config = ConfigDict(extra="ignore")

    model: str = ""
    max_input_tokens: int
    max_output_tokens: int
    max_words: int
    max_word_chars: int
    max_batch_lines: int | None = None  # None: an api from before batches


@dataclass(frozen=True)
class RunStarted:
    """The api accepted the run: its prediction id (from the X-Prediction-Id header)."""

    id: str


StreamEvent = (
    RunStarted | str | PredictionView
)  # the id, then text pieces, then the final prediction


def _error_message(response: httpx.Response) -> str:
    # The api answers errors in the OpenAI shape: {"error": {"message", "type", "param"}}.
    try:
        body = response.json()
        message = body["error"]["message"]
        if isinstance(message, str) and message:
            return message
    except (ValueError, KeyError, TypeError):
        pass
    reason = response.reason_phrase or "error"
    return f"the api answered {response.status_code} {reason}"


class ApiClient:
    """An httpx client for the api's predictions routes; one per playground process."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_connections: int = 100,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout_s = timeout_s
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=max_connections),
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def _transport_error(self, error: httpx.TransportError) -> PlaygroundError:
        if isinstance(error, httpx.TimeoutException):
            return PlaygroundError(
                f"The api at {self.base_url} did not answer within {self._timeout_s:g} s. "
                "It may be overloaded; try again in a moment."
            )
        return PlaygroundError(
            f"The api at {self.base_url} cannot be reached ({type(error).__name__}). "
            "Is it running? Try again in a moment."
        )

    async def send(self, method: str, path: str, **options: Any) -> httpx.Response:
        """Any route's answer (batch_client.py's too); failures as a PlaygroundError."""
        try:
            response = await self._client.request(method, path, **options)
        except httpx.TransportError as error:
            raise self._transport_error(error) from None
        if response.is_error:
            raise PlaygroundError(_error_message(response), status_code=response.status_code)
        return response

    async def _json(self, method: str, path: str, **options: Any) -> Any:
        response = await self.send(method, path, **options)
        try:
            return response.json()
        except ValueError:
            raise PlaygroundError("the api answered something that is not JSON") from None

    async def get(self, prediction_id: str) -> PredictionView:
        return _prediction(await self._json("GET", f"/v1/predictions/{prediction_id}"))

    async def cancel(self, prediction_id: str) -> PredictionView:
        return _prediction(await self._json("POST", f"/v1/predictions/{prediction_id}/cancel"))

    async def limits(self) -> EngineLimits:
        body = await self._json("GET", "/v1/limits")
        try:
            return EngineLimits.model_validate(body)
        except ValidationError:
            raise PlaygroundError("the api's limits have an unexpected shape") from None

    async def adapters(self) -> list[AdapterInfo] | None:
        """The registered adapters, or None when this api serves none (turned off, or too old)."""
        try:
            body = await self._json("GET", "/v1/adapters")
        except PlaygroundError as failure:
            if failure.status_code in ADAPTERS_OFF:
                return None
            raise
        try:
            return [AdapterInfo.model_validate(item) for item in body["data"]]
        except (KeyError, TypeError, ValidationError):
            raise PlaygroundError("the api's list of adapters has an unexpected shape") from None

    async def list(self, *, limit: int = 20, source: str | None = None) -> list[PredictionView]:
        params: dict[str, str | int] = {"limit": limit}
        if source:
            params["source"] = source
        body = await self._json("GET", "/v1/predictions", params=params)
        try:
            return [PredictionView.model_validate(item) for item in body["results"]]
        except (KeyError, TypeError, ValidationError):
            raise PlaygroundError("the api's list of predictions has an unexpected shape") from None

    async def stream_prediction(
        self, generation_input: dict[str, Any]
    ) -> AsyncGenerator[StreamEvent, None]:
        """Start a prediction and stream it: RunStarted, text pieces, then the final PredictionView.

        Closing the iterator early closes the HTTP stream, which the api takes as a cancel.
        """
        body = {"input": generation_input, "stream": True, "source": "playground"}
        try:
            async with self._client.stream("POST", "/v1/predictions", json=body) as response:
                if response.is_error:
                    await response.aread()
                    raise PlaygroundError(
                        _error_message(response), status_code=response.status_code
                    )
                prediction_id = response.headers.get("x-prediction-id")
                if prediction_id:
                    yield RunStarted(prediction_id)
                async for event, data in server_sent_events(response):
                    if event == "output":
                        yield data
                    elif event == "done":
                        yield _prediction(_loads(data))
                        return
                    # `error` is followed by `done`, which carries the message and the permalink.
        except httpx.TransportError as error:
            raise self._transport_error(error) from None
        raise PlaygroundError("the api ended the answer early (its stream closed); try again")


def _loads(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        raise PlaygroundError("the api answered something that is not JSON") from None


def _prediction(body: Any) -> PredictionView:
    try:
        return PredictionView.model_validate(body)
    except ValidationError:
        raise PlaygroundError("the api's prediction has an unexpected shape") from None
