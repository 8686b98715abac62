"""The benchmarks' CPU accounting (scripts/benchmarks/proc.py) against a real busy process."""

from __future__ import annotations

import subprocess
import sys
import time

from tritonbox_testing.repo_scripts import script_module

BUSY_S = 1.0


def test_the_server_measured_is_not_counted_in_the_others_load() -> None:
    """Over the same second, a process spinning on a core is in the others' load when it is
    not the server measured, and is not when it is."""
    OthersLoad = script_module("scripts.benchmarks.proc").OthersLoad
    spin = f"import time\nend = time.monotonic() + {BUSY_S + 1}\nwhile time.monotonic() < end: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.2)  # started, spinning
        unseen, measured = OthersLoad([]), OthersLoad([busy.pid])
        started = time.perf_counter()
        time.sleep(BUSY_S)
        wall = time.perf_counter() - started
        without, with_it = unseen.cores(wall), measured.cores(wall)
    finally:
        busy.kill()
        busy.wait()
    # The spinner's core, less what another test's process may take from it meanwhile.
    assert without - with_it > 0.5, (without, with_it)
