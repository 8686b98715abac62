"""Errors shared by the Triton models."""

from __future__ import annotations


class RequestError(ValueError):
    """A request that cannot be served; the message goes back to that request's client only."""
