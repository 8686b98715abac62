"""The `openai` SDK against the session's api, for the OpenAI route tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest


@pytest.fixture
def client(api_server: Any) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{api_server.url}/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id
