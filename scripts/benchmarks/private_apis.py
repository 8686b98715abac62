"""What each private API, and each hand-written stand-in for a library, still buys (issue 44.4).

    PYTHONSAFEPATH=1 .venv/bin/python scripts/benchmarks/private_apis.py [--rounds N]

Every pair is measured A/B interleaved, round after round, and reported as medians over the
rounds with the load average, so a shared machine's noise falls on both sides alike:

- grpc's `_registered_method=True` on the ModelStreamInfer call: µs per call, one request and
  its one response through a local gRPC server (the smallest call, so the largest share);
- the api's hand-written event queue (as it was, from git) against asyncio.Queue: µs per token,
  one producer and one consumer on uvloop (the api's loop), against the api's ~300 µs of CPU
  per token (docs/benchmark-api-changes.md);
- guided.py's hand-written schema check (as it was) against jsonschema's meta-schema check, a
  schema first seen and seen before: µs per schema;
- gradio's queue loops, as shipped and as quiet_queue.py has them: an idle server's CPU share.
docs/dependencies.md has the figures and what was kept.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import uvloop
from tritonclient.grpc import service_pb2

from tritonbox_common.client import STREAM_INFER, _channel_args
from tritonbox_common.request_tensors import GenerationRequest, build_inputs
from tritonbox_common.triton_private import inference_request

REPO = Path(__file__).resolve().parents[2]
BEFORE = "2379750"  # the commit before the hand-written queue and schema check were replaced
CALLS = 400
TOKENS = 20_000
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": ["string", "null"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age"],
    "$defs": {"id": {"anyOf": [{"type": "integer"}, {"type": "string"}]}},
}


def interleaved(rounds: int, sides: dict[str, Callable[[], float]]) -> dict[str, float]:
    """Each side's median over `rounds`, the sides alternating within every round."""
    seen: dict[str, list[float]] = {name: [] for name in sides}
    for index in range(rounds):
        order = list(sides) if index % 2 == 0 else list(reversed(sides))
        for name in order:
            seen[name].append(sides[name]())
    return {name: statistics.median(values) for name, values in seen.items()}


def _answer(requests: Iterator[Any], context: Any) -> Iterator[Any]:
    for _ in requests:
        yield service_pb2.ModelStreamInferResponse(error_message="noted")


def registered_method(rounds: int) -> dict[str, float]:
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    _, service, method = STREAM_INFER.split("/")
    handler = grpc.stream_stream_rpc_method_handler(
        _answer,
        request_deserializer=service_pb2.ModelInferRequest.FromString,
        response_serializer=service_pb2.ModelStreamInferResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    message = inference_request("ensemble", "id", build_inputs(GenerationRequest("a prompt", 16)))

    async def run() -> dict[str, float]:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=_channel_args())
        calls = {
            name: channel.unary_stream(
                STREAM_INFER,
                request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
                _registered_method=registered,
            )
            for name, registered in (("registered", True), ("plain", False))
        }
        for call in calls.values():  # connected, and each path warm
            async for _ in call(message):
                pass
        seen: dict[str, list[float]] = {name: [] for name in calls}
        for index in range(rounds):
            for name in calls if index % 2 == 0 else reversed(list(calls)):
                started = time.perf_counter()
                for _ in range(CALLS):
                    async for _ in calls[name](message):
                        pass
                seen[name].append((time.perf_counter() - started) / CALLS * 1e6)
        await channel.close()
        return {name: statistics.median(values) for name, values in seen.items()}

    try:
        return asyncio.run(run())
    finally:
        server.stop(None)


def before(path: str, name: str) -> Any:
    """`name` from `path` as it was at BEFORE: the hand-written code this replaced."""
    text = subprocess.run(
        ["git", "show", f"{BEFORE}:{path}"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    module = types.ModuleType(f"before_{Path(path).stem}")
    sys.modules[module.__name__] = module
    exec(compile(text, path, "exec"), module.__dict__)
    return getattr(module, name)


def event_queue(rounds: int) -> dict[str, float]:
    hand = before("api/tritonbox_api/service/running.py", "EventQueue")

    def side(make: Callable[[], Any]) -> Callable[[], float]:
        async def run() -> float:
            queue = make()

            async def produce() -> None:
                for _ in range(TOKENS):
                    queue.put_nowait("token")
                    await asyncio.sleep(0)  # the next response: a turn of the loop

            producer = asyncio.create_task(produce())
            started = time.perf_counter()
            for _ in range(TOKENS):
                await queue.get()
            elapsed = time.perf_counter() - started
            await producer
            return elapsed / TOKENS * 1e6

        return lambda: uvloop.run(run())

    return interleaved(rounds, {"hand-written": side(hand), "asyncio.Queue": side(asyncio.Queue)})


def schema_check(rounds: int) -> dict[str, float]:
    from tritonbox_common import guided

    hand = before("common/tritonbox_common/guided.py", "check_schema")

    def timed(check: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            for _ in range(200):
                check()
            return (time.perf_counter() - started) / 200 * 1e6

        return run

    def first_seen() -> None:
        guided._valid.clear()
        guided.check_schema(SCHEMA)

    sides = {
        "hand-written": timed(lambda: hand(SCHEMA)),
        "jsonschema, first seen": timed(first_seen),
        "jsonschema, seen before": timed(lambda: guided.check_schema(SCHEMA)),
    }
    return interleaved(rounds, sides)


IDLE_APP = """
import sys, time, gradio as gr
from tritonbox_playground.quiet_queue import quieten
with gr.Blocks(analytics_enabled=False) as demo:
    box = gr.Textbox(); box.submit(lambda t: t, box, box)
demo.queue()
if sys.argv[1] == "quiet":
    quieten(demo)
demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=int(sys.argv[2]))
print("up", flush=True); time.sleep(3600)
"""


def gradio_idle(rounds: int, seconds: float) -> dict[str, float]:
    def side(kind: str) -> Callable[[], float]:
        def run() -> float:
            process = subprocess.Popen(
                [sys.executable, "-c", IDLE_APP, kind, str(free_port())],
                stdout=subprocess.PIPE, env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"},
            )  # fmt: skip
            try:
                assert process.stdout is not None
                while process.stdout.readline().strip() != b"up":  # gradio's lines first
                    assert process.poll() is None, "the gradio server did not start"
                time.sleep(2)  # start-up over
                before, started = _cpu_seconds(process.pid), time.monotonic()
                time.sleep(seconds)
                return (_cpu_seconds(process.pid) - before) / (time.monotonic() - started) * 100
            finally:
                process.kill()
                process.wait()

        return run

    return interleaved(rounds, {"gradio's loops": side("plain"), "quiet_queue": side("quiet")})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", choices=["grpc", "queue", "schema", "gradio"], action="append")
    parser.add_argument("--idle-seconds", type=float, default=8.0)
    args = parser.parse_args()
    only = set(args.only or ["grpc", "queue", "schema", "gradio"])
    print(f"load average before: {os.getloadavg()}, cpus: {os.cpu_count()}")
    parts: list[tuple[str, str, Callable[[], dict[str, float]]]] = [
        ("grpc", "µs per call", lambda: registered_method(args.rounds)),
        ("queue", "µs per token", lambda: event_queue(args.rounds)),
        ("schema", "µs per check", lambda: schema_check(args.rounds)),
        ("gradio", "% of a core, idle",
         lambda: gradio_idle(max(3, args.rounds // 2), args.idle_seconds)),
    ]  # fmt: skip
    for key, unit, measure in parts:
        if key in only:
            medians = measure()
            shown = ", ".join(f"{name} {value:.2f}" for name, value in medians.items())
            print(f"{key} ({unit}, median of rounds): {shown}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
