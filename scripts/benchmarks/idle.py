"""What the stack costs when nobody uses it: CPU time of every process over a quiet minute.

Starts the native stack (`scripts/up`, the cpu engine and the default model, API_WORKERS api
processes) on free ports with a throwaway database, waits until the api is ready, warms the
engine with one short completion, lets it settle, then reads each process's utime + stime from
/proc before and after `--seconds` of no traffic. With `--browser`, one headless Chromium tab
stays open on the playground meanwhile (what a forgotten tab costs). Writes docs/idle.md.
Usage (from the repo root):

    scripts/benchmark idle [--seconds 60] [--workers 2] [--browser]
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from scripts.benchmarks.proc import (
    cpu_by_pid,
    machine_cpu_seconds,
    process_tree,
    processes_now,
    stop_group,
)
from tritonbox_testing.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
TARGET_PERCENT = 0.5  # of one core, per service process (issue: idle costs nothing)


@dataclass(frozen=True)
class Stack:
    up: subprocess.Popen[bytes]
    api_url: str
    playground_url: str


@contextlib.contextmanager
def native_stack(folder: Path, workers: int) -> Iterator[Stack]:
    triton_http, triton_grpc, triton_metrics, api, playground = free_ports(5)
    env_file = folder / ".env"
    env_file.write_text(
        "\n".join(
            [
                f"TRITON_HTTP_PORT={triton_http}",
                f"TRITON_GRPC_PORT={triton_grpc}",
                f"TRITON_METRICS_PORT={triton_metrics}",
                f"API_PORT={api}",
                f"PLAYGROUND_PORT={playground}",
                f"API_WORKERS={workers}",
                f"DATABASE_PATH={folder / 'predictions.db'}",
                "",
            ]
        )
    )
    log = (folder / "up.log").open("wb")
    up = subprocess.Popen(
        [str(REPO / "scripts" / "up"), "--env-file", str(env_file)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stack = Stack(up, f"http://127.0.0.1:{api}", f"http://127.0.0.1:{playground}")
    try:
        _wait_ok(f"{stack.api_url}/readyz", up, folder / "up.log")
        _wait_ok(stack.playground_url, up, folder / "up.log")
        yield stack
    finally:
        stop_group(up)
        log.close()


def _wait_ok(url: str, up: subprocess.Popen[bytes], log: Path, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise RuntimeError(f"scripts/up exited ({up.returncode}):\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=5).status_code == 200:
                return
        time.sleep(1)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s")


def _label(pid: int) -> str:
    """A short name for a process of the stack, from its command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    text = b" ".join(argv).decode(errors="replace")
    for marker, name in [
        ("parent_watch.py", "stub watcher"),
        ("triton_python_backend_stub", "python-backend stub"),
        ("tritonserver", "tritonserver"),
        ("tritonbox-triton", "triton"),
        ("resource_tracker", "multiprocessing resource tracker"),
        ("multiprocessing", "api worker"),
        ("tritonbox-api", "api"),
        ("tritonbox-playground", "playground"),
    ]:
        if marker in text:
            if name == "python-backend stub":
                model = next((a for a in argv if a.endswith(b"/1/model.py")), b"?/1/model.py")
                return f"{name}: {Path(model.decode(errors='replace')).parts[-3]}"
            return name
    return Path(argv[0].decode(errors="replace")).name or "?"


def services(up_pid: int) -> dict[str, list[int]]:
    """Each service's processes: what `scripts/up` started, one per service, and everything
    descended from it (tritonserver runs in a session of its own under the triton launcher)."""
    table = processes_now()
    leaders = [pid for pid, (parent, _) in table.items() if parent == up_pid]
    return {_label(leader): sorted(process_tree(leader, table)) for leader in leaders}


Row = tuple[str, str, float, float | None]  # service, process, % idle, % with a tab open


def measure(stack: Stack, seconds: float) -> tuple[dict[int, float], float]:
    """% of a core each process of the stack spent over `seconds`, and the machine's busy cores."""
    pids = [pid for group in services(stack.up.pid).values() for pid in group]
    before, machine_before = cpu_by_pid(pids), machine_cpu_seconds()
    time.sleep(seconds)
    after, machine_after = cpu_by_pid(pids), machine_cpu_seconds()
    spent = {pid: 100 * (after[pid] - before[pid]) / seconds for pid in before if pid in after}
    return spent, (machine_after - machine_before) / seconds


def report(rows: list[Row], machine: list[float], args: argparse.Namespace) -> str:
    tab = args.browser
    lines = [
        "# Idle cost",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} by `scripts/benchmark idle"
        f"{' --browser' if tab else ''} --seconds {args.seconds:.0f} --workers {args.workers}`:"
        f" the native stack (cpu engine, default model, {args.workers} api workers) warmed by one"
        f" request, then {args.seconds:.0f} s with no traffic"
        f"{', then the same with one playground tab open in headless Chromium' if tab else ''}."
        " CPU is utime + stime from `/proc/<pid>/stat`, as % of one core. Target: every process"
        f" < {TARGET_PERCENT}% of a core.",
        "",
        "| service | process | idle, % of a core |" + (" one tab open |" if tab else ""),
        "|---|---|---:|" + ("---:|" if tab else ""),
    ]
    for service, process, idle, with_tab in sorted(rows):
        cells = [service, process, f"{idle:.2f}"] + ([f"{with_tab:.2f}"] if tab else [])
        lines.append("| " + " | ".join(cells) + " |")
    worst = max(max(r[2], r[3] or 0.0) for r in rows)
    lines += [
        "",
        f"Highest: {worst:.2f}% of a core — target {'met' if worst < TARGET_PERCENT else 'MISSED'}."
        " The whole machine was busy "
        + " / ".join(f"{cores:.2f}" for cores in machine)
        + " cores meanwhile (other load on this shared machine included).",
        "",
        "What still wakes when idle, and why:",
        "",
        "- each api worker: a heartbeat row every 5 s (so another worker can tell this one died)"
        " and, every 0.2 s, a look at its own in-memory list of running predictions (a database"
        " query only when that list is non-empty: cancels made through another worker);",
        "- the engine: nothing; its loop sleeps until a request arrives (it wakes every 50 ms"
        " only while requests run or wait, to notice cancelled clients);",
        "- each Python-backend stub's watcher: every 0.25 s it checks that tritonserver is still"
        " the stub's parent, so a stub never outlives its server (parent_watch.py says why a"
        " process of its own);",
        "- the playground: Gradio's queue waits for work (quiet_queue.py) instead of polling"
        " every 1 ms; an open tab sends Gradio's heartbeat every 15 s;",
        "- tritonserver: its own threads (metrics are computed when `/metrics` is scraped).",
        "",
    ]
    return "\n".join(lines)


def _open_tab(url: str) -> contextlib.AbstractContextManager[object]:
    from tritonbox_testing.browser import chromium

    @contextlib.contextmanager
    def tab() -> Iterator[object]:
        with chromium() as browser:
            page = browser.new_page()
            page.goto(url, wait_until="load")  # not "networkidle": a poll never lets it settle
            yield page

    return tab()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--browser", action="store_true", help="one playground tab stays open")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "idle.md")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="tritonbox-idle-") as tmp,
        native_stack(Path(tmp), args.workers) as stack,
    ):
        body = {"prompt": "Hello", "max_tokens": 4}
        httpx.post(f"{stack.api_url}/predict", json=body, timeout=120).raise_for_status()
        time.sleep(10)  # settle: the warm request's row is written, its stream closed
        labels = {
            pid: (service, _label(pid))
            for service, group in services(stack.up.pid).items()
            for pid in group
        }
        idle, machine_idle = measure(stack, args.seconds)
        with_tab: dict[int, float] = {}
        machine = [machine_idle]
        if args.browser:
            with _open_tab(stack.playground_url):
                time.sleep(10)  # the page's first requests
                with_tab, machine_tab = measure(stack, args.seconds)
                machine.append(machine_tab)
    rows: list[Row] = [(*labels[pid], spent, with_tab.get(pid)) for pid, spent in idle.items()]
    text = report(rows, machine, args)
    print(text)
    args.output.write_text(text)
    return 0
