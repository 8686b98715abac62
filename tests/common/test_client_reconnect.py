"""The ensemble client connects to a Triton that comes up after it within about a second, however
long it has been trying (client.py's channel options): gRPC's own backoff grows to minutes."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from tritonbox_testing.ports import free_ports
from tritonclient.utils import InferenceServerException

from tritonbox_common.client import TritonLLMClient


async def _answered(client: TritonLLMClient) -> bool:
    """Whether a call reached a server (this one implements nothing, so it says so)."""
    try:
        await client.server.is_server_live()
    except InferenceServerException as error:
        return "UNAVAILABLE" not in str(error.status())
    return True


def test_a_server_that_comes_up_late_is_reached_within_a_second() -> None:
    port = free_ports(1)[0]

    async def scenario() -> float:
        client = TritonLLMClient(f"127.0.0.1:{port}")
        try:
            tried_until = time.monotonic() + 8  # gRPC's default backoff reaches ~4-7 s by then
            while time.monotonic() < tried_until:
                assert not await _answered(client)
                await asyncio.sleep(0.2)
            server = grpc.aio.server()
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            up = time.monotonic()
            try:
                while not await _answered(client):
                    await asyncio.sleep(0.05)
                    if time.monotonic() - up > 15:
                        pytest.fail("the client never reached the server")
                return time.monotonic() - up
            finally:
                await server.stop(None)
        finally:
            await client.close()

    assert asyncio.run(scenario()) < 2.0  # at most 1 s (+20% jitter) between attempts
