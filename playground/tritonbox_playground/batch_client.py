"""The Batch tab's calls to the api's OpenAI Batch API (`/v1/files`, `/v1/batches`), through
the playground's one ApiClient: the same address, key and error messages as every run."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from tritonbox_playground.api_client import ApiClient, PlaygroundError

CHAT_ROUTE = "/v1/chat/completions"
# A batch's own statuses after which nothing changes (docs/batches.md).
ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
# The api's window for a batch made here: OpenAI's usual one; the person waits for it, or not.
WINDOW = "24h"


class RequestCounts(BaseModel):
    model_config = ConfigDict(extra="ignore")

    total: int = 0
    completed: int = 0
    failed: int = 0

    @property
    def done(self) -> int:
        return self.completed + self.failed


class BatchView(BaseModel):
    """The part of the api's batch object the Batch tab shows."""

    model_config = ConfigDict(extra="ignore")

    id: str
    status: str
    input_file_id: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int = 0
    in_progress_at: int | None = None
    request_counts: RequestCounts = RequestCounts()
    errors: dict[str, Any] | None = None

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    def problems(self) -> list[str]:
        """The batch's own errors (an empty file, say): not any line's."""
        data = (self.errors or {}).get("data") or []
        return [str(item.get("message", "")) for item in data if isinstance(item, dict)]


def _batch(body: Any) -> BatchView:
    try:
        return BatchView.model_validate(body)
    except ValidationError:
        raise PlaygroundError("the api's batch has an unexpected shape") from None


async def _json(api: ApiClient, method: str, path: str, **options: Any) -> Any:
    response = await api.send(method, path, **options)
    try:
        return response.json()
    except ValueError:
        raise PlaygroundError("the api answered something that is not JSON") from None


async def upload(api: ApiClient, filename: str, content: bytes) -> str:
    """Upload a batch's input file; its id."""
    files = {"file": (filename, content, "application/jsonl")}
    body = await _json(api, "POST", "/v1/files", files=files, data={"purpose": "batch"})
    if not isinstance(body, dict) or not isinstance(body.get("id"), str):
        raise PlaygroundError("the api's file has an unexpected shape")
    return body["id"]


async def create(api: ApiClient, file_id: str, metadata: dict[str, str]) -> BatchView:
    body = {
        "input_file_id": file_id,
        "endpoint": CHAT_ROUTE,
        "completion_window": WINDOW,
        "metadata": metadata,
    }
    return _batch(await _json(api, "POST", "/v1/batches", json=body))


async def get(api: ApiClient, batch_id: str) -> BatchView:
    return _batch(await _json(api, "GET", f"/v1/batches/{batch_id}"))


async def cancel(api: ApiClient, batch_id: str) -> BatchView:
    return _batch(await _json(api, "POST", f"/v1/batches/{batch_id}/cancel"))


async def content(api: ApiClient, file_id: str | None) -> bytes:
    """A file's bytes as the api keeps them (b"" for none: a batch without errors has no
    error file)."""
    if not file_id:
        return b""
    return (await api.send("GET", f"/v1/files/{file_id}/content")).content
