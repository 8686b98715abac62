"""Fixtures for the service tests."""

from __future__ import annotations

import huggingface_hub.constants
import pytest


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub answers from its cache only (the hub is not reachable from tests)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
