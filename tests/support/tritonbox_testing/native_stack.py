"""The native stack (`scripts/lib/run_stack.py`, what `scripts/up` runs) as a user runs it, on free
ports, and what it leaves behind once stopped.

Every process of one stack carries its folder: in its command line (`--env-file FOLDER/.env`,
the model repository FOLDER/repo that tritonserver and its Python-backend stubs name) and in its
environment (MARK_VARIABLE, inherited by every descendant). Other stacks on the same machine
(other test sessions, other checkouts) carry neither, so `leftovers()` never sees them. Shared
memory is attributed the same way: the stubs name their region on their command line, and
tritonserver names the prefix of its regions (`shm-region-prefix-name`); a sampler notes both
while the stack runs.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tritonbox_testing.ports import free_ports
from tritonbox_testing.processes import (
    Process,
    marked_processes,
    region_prefixes,
    stub_regions,
)

REPO = Path(__file__).resolve().parents[3]
RUN_STACK = REPO / "scripts" / "lib" / "run_stack.py"
MARK_VARIABLE = "TRITONBOX_TEST_STACK"
SHM = Path("/dev/shm")


def env_without_settings() -> dict[str, str]:
    """This environment without TritonBox settings a developer exported (they would win over
    the stack's .env)."""
    from tritonbox_api.settings import ApiSettings
    from tritonbox_playground.settings import PlaygroundSettings
    from tritonbox_triton.settings import TritonSettings

    names = {"HF_TOKEN"}
    for cls in (TritonSettings, ApiSettings, PlaygroundSettings):
        names |= {name.upper() for name in cls.model_fields}
    return {key: value for key, value in os.environ.items() if key not in names}


@dataclass(frozen=True)
class Leftovers:
    processes: list[Process]
    regions: list[str]
    after_s: float

    def __bool__(self) -> bool:
        return bool(self.processes or self.regions)


@dataclass
class NativeStack:
    """One `run_stack.py` in `folder`: its own ports, model repository, database and log."""

    folder: Path
    without: tuple[str, ...] = ()
    ports: list[int] = field(default_factory=lambda: free_ports(5))
    process: subprocess.Popen[bytes] | None = None
    regions: set[str] = field(default_factory=set)
    prefixes: set[str] = field(default_factory=set)
    commands: set[str] = field(default_factory=set)  # every command line seen, for reports

    @property
    def mark(self) -> str:
        return str(self.folder)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.ports[3]}"

    @property
    def metrics(self) -> str:
        return f"http://127.0.0.1:{self.ports[2]}/metrics"

    @property
    def database(self) -> Path:
        return self.folder / "predictions.db"

    @property
    def log(self) -> Path:
        return self.folder / "stack.log"

    def write_env(self, **extra: object) -> Path:
        http, grpc, metrics, api, playground = self.ports
        values: dict[str, object] = {
            "ENGINE": "cpu",
            "CACHE_DIR": REPO / ".cache",  # the default model, prepared once per machine
            "MODEL_REPOSITORY": self.folder / "repo",
            "MAX_INPUT_LEN": 512,
            "MAX_OUTPUT_LEN": 512,
            "TRITON_HTTP_PORT": http,
            "TRITON_GRPC_PORT": grpc,
            "TRITON_METRICS_PORT": metrics,
            "API_PORT": api,
            "PLAYGROUND_PORT": playground,
            "DATABASE_PATH": self.database,
            "PUBLIC_URL": f"http://127.0.0.1:{api}",
            "PLAYGROUND_URL": f"http://127.0.0.1:{playground}",
            **{key.upper(): value for key, value in extra.items()},
        }
        path = self.folder / ".env"
        path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
        return path

    def start(self, *, background: bool = False, **settings: object) -> None:
        """Start run_stack.py in a session of its own, as a terminal's foreground job would be;
        `background`: with SIGINT ignored, as `scripts/up &` in a script starts it; `settings`:
        more .env lines (`triton_ready_timeout_s=5`)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        env_file = self.write_env(**settings)
        command = [sys.executable, str(RUN_STACK), "--env-file", str(env_file)]
        for name in self.without:
            command += ["--without", name]
        env = env_without_settings() | {MARK_VARIABLE: self.mark, "PYTHONSAFEPATH": "1"}

        def set_sigint() -> None:
            # Set either way: a test runner started in the background (`... &` in a script)
            # passes SIGINT on ignored, and a foreground job's Ctrl-C must still reach it.
            signal.signal(signal.SIGINT, signal.SIG_IGN if background else signal.SIG_DFL)

        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=set_sigint,
            )
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        """Notes the stack's shared memory as it appears, until run_stack.py has ended."""
        process = self.process
        while process is not None and process.poll() is None:
            self.note_regions()
            time.sleep(0.2)

    def wait_ready(self, timeout_s: float = 600) -> None:
        """Until run_stack.py says the stack is ready."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while "TritonBox is ready" not in self.log.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the stack did not start:\n{self.log_tail()}")
            time.sleep(0.5)
        self.note_regions()

    def note_regions(self) -> None:
        processes = self.processes()
        self.regions |= stub_regions(processes)
        self.prefixes |= region_prefixes(processes)
        self.commands |= {p.command.split(" ", 1)[0] for p in processes}

    def shared_memory(self) -> list[str]:
        """The stack's regions still in /dev/shm: those its stubs named, and any other with a
        prefix its tritonservers were given."""
        names = {name for name in self.regions if (SHM / name).exists()}
        for prefix in self.prefixes:
            names |= {path.name for path in SHM.glob(f"{glob.escape(prefix)}*")}
        return sorted(names)

    def processes(self) -> list[Process]:
        return marked_processes(self.mark)

    def pid_of(self, word: str) -> int:
        """The pid of the stack's process whose command line starts with a path ending in
        `word` (tritonserver, tritonbox-api, ...)."""
        for process in self.processes():
            first = process.command.split(" ", 2)
            if any(part.endswith(word) for part in first[:2]):
                return process.pid
        raise AssertionError(f"no {word} among {self.processes()}")

    def leftovers(self, stopped_at: float, within_s: float = 10.0) -> Leftovers:
        """What is still there `within_s` after `stopped_at` (time.monotonic()), or as soon as
        nothing is: processes (zombies are dead: they hold no memory, only a pid until their
        parent reaps them) and shared-memory regions."""
        deadline = stopped_at + within_s
        while True:
            alive = [p for p in self.processes() if p.state != "Z"]
            regions = self.shared_memory()
            if (not alive and not regions) or time.monotonic() > deadline:
                if self.process is not None:  # reaped: run_stack.py is the test's child
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.process.wait(max(0.0, deadline - time.monotonic()))
                return Leftovers(alive, regions, time.monotonic() - stopped_at)
            time.sleep(0.1)

    def kill_everything(self) -> None:
        """The test's own clean-up, whatever the stack left: nothing of it may outlive a test."""
        for process in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()
        for name in self.shared_memory():
            with contextlib.suppress(FileNotFoundError):
                (SHM / name).unlink()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def row_status(self, prediction_id: str) -> str:
        with contextlib.closing(sqlite3.connect(self.database)) as db:
            row = db.execute("select status from prediction where id = ?", (prediction_id,))
            found = row.fetchone()
        return str(found[0]) if found else "(no row)"


@contextlib.contextmanager
def native_stack(folder: Path, **options: object) -> Iterator[NativeStack]:
    """A NativeStack that is killed outright (and its regions removed) however the test ends."""
    stack = NativeStack(folder, **options)  # type: ignore[arg-type]
    try:
        yield stack
    finally:
        stack.kill_everything()
