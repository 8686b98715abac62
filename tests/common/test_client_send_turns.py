"""A request leaves for Triton within two or three turns of the caller's event loop (client.py says
why it is called as unary-stream): under a burst every turn waits behind the other requests'
work, and a bidirectional call's three turns kept the engine waiting for the last of a wave."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import pytest
from tritonbox_testing.ports import free_ports
from tritonclient.grpc import service_pb2

from tritonbox_common.client import (
    STREAM_INFER,
    GenerationRequest,
    TritonLLMClient,
    TritonRequestError,
)

BUSY_TURN_S = 0.02  # what one turn of a busy loop costs here (another request's route, say)


class BusyLoop:
    """Keeps the event loop busy: each of its turns blocks for BUSY_TURN_S, then yields."""

    def __init__(self) -> None:
        self.turns = 0

    async def run(self) -> None:
        while True:
            self.turns += 1
            time.sleep(BUSY_TURN_S)
            await asyncio.sleep(0)


@dataclass
class TritonStandIn:
    """Triton's ModelStreamInfer, as far as this test needs it: each request's id and the busy
    loop's turn when it arrived are noted, and it is answered with an error."""

    url: str
    busy: BusyLoop = field(default_factory=BusyLoop)
    arrivals: list[tuple[str, int]] = field(default_factory=list)

    def stream_infer(
        self, requests: Iterator[service_pb2.ModelInferRequest], context: grpc.ServicerContext
    ) -> Iterator[service_pb2.ModelStreamInferResponse]:
        for request in requests:
            self.arrivals.append((request.id, self.busy.turns))
            yield service_pb2.ModelStreamInferResponse(error_message="noted")


@pytest.fixture
def triton() -> Iterator[TritonStandIn]:
    port = free_ports(1)[0]
    stand_in = TritonStandIn(f"127.0.0.1:{port}")
    _, service, method = STREAM_INFER.split("/")
    handler = grpc.stream_stream_rpc_method_handler(
        stand_in.stream_infer,
        request_deserializer=service_pb2.ModelInferRequest.FromString,
        response_serializer=service_pb2.ModelStreamInferResponse.SerializeToString,
    )
    # A server of its own threads: the client's busy loop does not hold it up.
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    methods = grpc.method_handlers_generic_handler(service, {method: handler})
    server.add_generic_rpc_handlers((methods,))
    server.add_insecure_port(stand_in.url)
    server.start()
    try:
        yield stand_in
    finally:
        server.stop(None)


def test_a_request_leaves_within_three_turns_of_a_busy_event_loop(triton: TritonStandIn) -> None:
    async def scenario() -> list[int]:
        client = TritonLLMClient(triton.url)
        busy = asyncio.create_task(triton.busy.run())
        # Connected first, as the api's channel is (the stand-in has no ServerLive: the
        # connection is what counts).
        with contextlib.suppress(Exception):
            await client.server.is_server_live()
        delays = []
        try:
            for index in range(5):
                request = GenerationRequest("a prompt", 4, request_id=f"request-{index}")
                called = triton.busy.turns
                with pytest.raises(TritonRequestError, match="noted"):
                    async for _ in client.stream(request, stop_on_exit=False):
                        pass
                ids = [seen for seen, _ in triton.arrivals]
                delays.append(triton.arrivals[ids.index(request.request_id)][1] - called)
        finally:
            busy.cancel()
            await asyncio.gather(busy, return_exceptions=True)
            await client.close()
        return delays

    delays = asyncio.run(scenario())
    # The busy loop's turn after the call, then the send: the request arrives during the turn
    # after that (2), or the next if the server's thread is slow to read it (3). Called as a
    # bidirectional stream it arrived after 4-6.
    assert max(delays) <= 3, f"turns of the busy loop before each request arrived: {delays}"
