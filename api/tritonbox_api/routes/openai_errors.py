"""Refusals on the OpenAI routes as OpenAI's clients expect them (and vLLM answers them):
400 with OpenAI's error body, its `param` naming the field as the client sent it.

The native routes answer a bad field with 422; here the same checks answer 400. Checks made
after the request became a GenerationInput name its fields (`stop_words_list[1]`,
`bad_words_list`, `max_tokens`, `prompt`): `client_named` turns them back into the client's
(`stop[1]`, `bad_words`, `max_completion_tokens` when that is what the client sent, `messages`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from tritonbox_api.errors import validation_error
from tritonbox_api.protocol.errors import ApiError

# What the OpenAPI document says of these routes' 400.
REFUSED = "A refused request: `error.param` names the field as the client sent it."
_NAME = re.compile(r"^([A-Za-z_]+)(.*)$", re.DOTALL)


class OpenAIRoute(APIRoute):
    """A route whose refusals are 400, not 422 (pydantic's and the service's alike)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def refusing_with_400(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as error:
                raise validation_error(error, status_code=400) from None
            except ApiError as error:
                if error.status_code != 422:
                    raise
                error.status_code = 400
                raise

        return refusing_with_400


def client_param(param: str, request: Any, *, chat: bool) -> str:
    """`param` (a GenerationInput field, maybe indexed) as the OpenAI request `request` names it."""
    match = _NAME.match(param)
    if match is None:
        return param
    field, rest = match.groups()
    sent = request.model_fields_set
    if field == "stop_words_list":
        # One stop word sent as a string has no index to show.
        field, rest = "stop", "" if isinstance(request.stop, str) else rest
    elif field == "bad_words_list":
        field = "bad_words"
    elif field == "max_tokens" and chat and "max_completion_tokens" in sent:
        field = "max_completion_tokens"
    elif field == "prompt" and chat:
        field = "messages"  # the prompt the chat template made of them
    elif field == "guided_decoding":
        field = request.structured_field()  # response_format, guided_json, ...
    return field + rest


def client_named(error: ApiError, request: Any, *, chat: bool) -> ApiError:
    """`error` with its `param`, and the message that starts with it, in the client's names."""
    if error.param is None:
        return error
    named = client_param(error.param, request, chat=chat)
    if named == "min_tokens" and client_param("max_tokens", request, chat=chat) != "max_tokens":
        # Its limit is the answer's length: named as the client sent it, too.
        error.message = error.message.replace("max_tokens (", "max_completion_tokens (")
    if named != error.param:
        if error.message.startswith(f"{error.param}:"):
            error.message = named + error.message.removeprefix(error.param)
        error.param = named
    return error
