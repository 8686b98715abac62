"""Stop means stopped (issue 23): however the native stack (`scripts/up`) ends, within 10 s no
process of it is left and its Python-backend shared memory is gone, and a prediction that was
generating ends canceled or failed, never `processing`.

Each test starts the real stack on free ports (tritonserver with the cpu engine, the api, the
playground), warms the engine, starts a long streamed prediction, and ends the stack one way:
Ctrl-C, SIGTERM to a background start, SIGKILL of the supervisor, SIGKILL of Triton's launcher,
a crash of tritonserver, a failed start. Leftovers are found by what every process of the stack
carries (its folder, in its command line or environment), so other stacks on this machine never
count. TRITONBOX_STOP_LOOP=N adds the "done means" loop: N rounds of every way, each leaving
the process table and /dev/shm as it found them.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tritonbox_testing.native_stack import NativeStack, native_stack
from tritonbox_testing.processes import marked_processes
from tritonbox_testing.stack_traffic import ActiveRequests, Generation, warm

from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.settings import DEFAULT_MODEL_NAME

REPO = Path(__file__).resolve().parents[3]
WITHIN_S = 10.0


@pytest.fixture(scope="module", autouse=True)
def default_model() -> None:
    prepare_default_model(REPO / ".cache" / "models" / DEFAULT_MODEL_NAME)  # once per machine


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[NativeStack]:
    with native_stack(tmp_path / "stack") as running:
        yield running


def generating(
    stack: NativeStack, *, background: bool = False, playground: bool = False
) -> Generation:
    """The stack, ready, its engine warm, and a long prediction streaming. The playground only
    where it is asked for: its start costs seconds of CPU, and how it stops does not vary."""
    stack.without = () if playground else ("playground",)
    stack.start(background=background)
    stack.wait_ready()
    warm(stack.api)
    generation = Generation(stack.api)
    generation.wait_started()
    return generation


def assert_clean(stack: NativeStack, stopped_at: float) -> None:
    left = stack.leftovers(stopped_at, WITHIN_S)
    assert not left, f"{left}\n{stack.log_tail()}"
    assert stack.regions, "the stubs' shared memory was never seen: nothing was checked"
    print(f"nothing left {left.after_s:.1f} s after the stop")


def assert_row_ended(stack: NativeStack, generation: Generation) -> str:
    status = stack.row_status(generation.id)
    assert status in {"canceled", "failed"}, status
    return status


def pid_of_triton_launcher(stack: NativeStack) -> int:
    return stack.pid_of("tritonbox-triton")


def test_ctrl_c_stops_the_engine_then_everything(stack: NativeStack) -> None:
    """A terminal's Ctrl-C (SIGINT to the foreground process group): the api cancels the
    prediction and the engine stops it while Triton still serves; then all of it leaves."""
    generation = generating(stack, playground=True)
    active = ActiveRequests(stack.metrics)
    stopped_at = time.monotonic()
    assert stack.process is not None
    os.killpg(stack.process.pid, signal.SIGINT)
    assert_clean(stack, stopped_at)
    assert stack.process.returncode == 0
    assert active.settle(WITHIN_S) == 0, "Triton went away while the engine was still generating"
    assert assert_row_ended(stack, generation) == "canceled"


def test_sigterm_to_a_background_start(stack: NativeStack) -> None:
    """`scripts/up &` from a script starts it with SIGINT ignored (the services inherit that),
    then SIGTERM: the case that left the engine's stub behind."""
    generation = generating(stack, background=True)
    stopped_at = time.monotonic()
    assert stack.process is not None
    stack.process.send_signal(signal.SIGTERM)
    assert_clean(stack, stopped_at)
    assert assert_row_ended(stack, generation) == "canceled"


def test_the_supervisor_killed(stack: NativeStack) -> None:
    """SIGKILL of run_stack.py: the services are told by the kernel (parent-death signal)."""
    generation = generating(stack, playground=True)
    stopped_at = time.monotonic()
    assert stack.process is not None
    stack.process.kill()
    assert_clean(stack, stopped_at)
    assert_row_ended(stack, generation)


def test_the_triton_launcher_killed(stack: NativeStack) -> None:
    """SIGKILL of `tritonbox-triton serve`: tritonserver is killed by the kernel, its stubs by
    their watchers, which also remove their shared memory; the supervisor stops the rest."""
    generation = generating(stack)
    stopped_at = time.monotonic()
    os.kill(pid_of_triton_launcher(stack), signal.SIGKILL)
    assert_clean(stack, stopped_at)
    assert_row_ended(stack, generation)


def test_a_tritonserver_crash(stack: NativeStack) -> None:
    """tritonserver killed (a crash): its launcher ends the stubs and removes the regions."""
    generation = generating(stack)
    stopped_at = time.monotonic()
    os.kill(stack.pid_of("tritonserver"), signal.SIGKILL)
    assert_clean(stack, stopped_at)
    assert assert_row_ended(stack, generation) == "failed"


def start_and_fail(stack: NativeStack) -> float:
    """Start with a readiness time-out far below any model load (the engine's stub alone
    imports torch for longer; with 12 s a quick machine loaded the models in time and the
    stack served): the time run_stack.py was seen to exit 1."""
    stack.start(triton_ready_timeout_s=2)
    assert stack.process is not None
    assert stack.process.wait(120) == 1, stack.log_tail()
    return time.monotonic()


def test_a_failed_start(stack: NativeStack) -> None:
    """Triton not ready in time (TRITON_READY_TIMEOUT_S) while its models still load: the
    launcher gives up, the supervisor stops the rest, and nothing of the start stays."""
    stopped_at = start_and_fail(stack)
    assert "not ready after 2 s" in stack.log_tail(20000)
    left = stack.leftovers(stopped_at, WITHIN_S)
    assert not left, f"{left}\n{stack.log_tail()}"
    assert any(c.endswith("tritonserver") for c in stack.commands), stack.commands


WAYS: dict[str, Callable[[NativeStack], None]] = {
    "ctrl-c": lambda s: os.killpg(s.process.pid, signal.SIGINT) if s.process else None,
    "sigterm": lambda s: s.process.send_signal(signal.SIGTERM) if s.process else None,
    "supervisor-killed": lambda s: s.process.kill() if s.process else None,
    "triton-launcher-killed": lambda s: os.kill(pid_of_triton_launcher(s), signal.SIGKILL),
    "tritonserver-crash": lambda s: os.kill(s.pid_of("tritonserver"), signal.SIGKILL),
}


def shm_names() -> set[str]:
    return {path.name for path in Path("/dev/shm").iterdir()}


def checkout_processes() -> set[int]:
    """This checkout's processes (their command line names it), zombies aside."""
    return {p.pid for p in marked_processes(str(REPO)) if p.state != "Z"}


@pytest.mark.skipif(
    not os.environ.get("TRITONBOX_STOP_LOOP"), reason="the slow loop: TRITONBOX_STOP_LOOP=N"
)
@pytest.mark.timeout(3600 * 2)  # each round starts the stack once per way
def test_start_traffic_stop_loop(tmp_path: Path) -> None:
    """N rounds of every way, a failed start included: each round leaves the process table (this
    checkout's processes) and /dev/shm (the regions this stack used) as it found them."""
    rounds = int(os.environ["TRITONBOX_STOP_LOOP"])
    report = []
    for round_ in range(rounds):
        for name, stop in WAYS.items():
            with native_stack(tmp_path / f"{round_}-{name}") as stack:
                before, found = shm_names(), checkout_processes()
                generation = generating(stack, background=name == "sigterm", playground=True)
                stopped_at = time.monotonic()
                stop(stack)
                left = stack.leftovers(stopped_at, WITHIN_S)
                # Other checkouts' servers come and go in /dev/shm meanwhile: only this stack's
                # regions count, and this checkout's processes.
                new_shm = (shm_names() - before) & (stack.regions | set(stack.shared_memory()))
                new_processes = checkout_processes() - found
                status = stack.row_status(generation.id)
                report.append(f"{round_} {name}: {left.after_s:.1f} s, row {status}")
                print(report[-1], flush=True)
                assert not left and not new_shm and not new_processes, (name, left, new_shm)
                assert status in {"canceled", "failed"}, status
        with native_stack(tmp_path / f"{round_}-failed-start") as stack:  # no traffic to send
            before, found = shm_names(), checkout_processes()
            left = stack.leftovers(start_and_fail(stack), WITHIN_S)
            new_shm = (shm_names() - before) & (stack.regions | set(stack.shared_memory()))
            new_processes = checkout_processes() - found
            report.append(f"{round_} failed-start: {left.after_s:.1f} s")
            print(report[-1], flush=True)
            assert not left and not new_shm and not new_processes, ("failed-start", left, new_shm)
    print("\n".join(report))
