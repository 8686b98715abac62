"""Error bodies: the OpenAI shape on every route, so one client-side handler fits all."""

from __future__ import annotations

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    """An error the api answers with `status_code` and an OpenAI-style body."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorDetail(message=self.message, type=self.type, param=self.param)
        )


class FieldError(ValueError):
    """A request's field refused by a check the models make after validation: the field is
    data (`param`), so the route that answers names it without reading the message."""

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(f"{param}: {reason}")
        self.param = param
        self.reason = reason


def invalid(param: str, message: str) -> ApiError:
    """422 for one bad field: `message` says the limit and the value."""
    return ApiError(422, f"{param}: {message}", param=param)


def unavailable(message: str, retry_after_s: int = 5) -> ApiError:
    return ApiError(
        503, message, type="service_unavailable", headers={"Retry-After": str(retry_after_s)}
    )
