"""Free TCP ports for the servers the tests start."""

from __future__ import annotations

import contextlib
import socket


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports (all held open while choosing, so none repeats)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def free_port() -> int:
    return free_ports(1)[0]
