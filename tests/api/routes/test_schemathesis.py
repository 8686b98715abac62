"""schemathesis, a client nobody here wrote, against the live api and its own /openapi.json.

Every built-in check (no 5xx; statuses, media types, headers and bodies as declared; valid data
accepted, invalid data refused; auth; unsupported methods; resources gone after DELETE) on every
operation, in schemathesis's coverage and fuzzing phases, then its stateful phase (chains of
calls along the links it infers: a prediction created, then read and cancelled by its id). The
settings and the few justified exceptions are in schemathesis.toml beside this file.

It runs schemathesis's own CLI (`st run`), as a user would: its pytest integration cannot load
a schema from a fixture under pytest 9.2 (it sets `Node._nodeid`, which pytest 9.2 removed), and
the CLI's report is the one people read. The api runs on a Triton of its own whose
MAX_OUTPUT_LEN is 4, so no generated request generates long: one that leaves max_tokens out gets
4 tokens, and a larger max_tokens is refused.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.core.result import Ok
from tritonbox_testing.api_process import RunningApi, launch_api
from tritonbox_testing.priority import lowest_priority

ST = Path(sys.executable).parent / "st"
CONFIG = Path(__file__).with_name("schemathesis.toml")
# The operations where schemathesis.toml turns `positive_data_acceptance` off (and why, there).
UNSTATABLE = {
    "GET /v1/predictions",
    "POST /v1/adapters",
    "POST /predict",
    "POST /v1/predictions",
    "POST /v1/completions",
    "POST /v1/chat/completions",
}


@pytest.fixture(scope="module")
def short_api(
    triton_launcher: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningApi]:
    with triton_launcher(max_output_len=4) as triton:
        running = launch_api(triton, Path(tmp_path_factory.mktemp("schemathesis")))
        try:
            running.wait_ready()
            yield running
        finally:
            running.stop()


def test_schemathesis_finds_nothing(short_api: RunningApi, tmp_path: Path) -> None:
    # The exceptions reach exactly the operations named (an entry's filters are easy to get
    # wider than meant), and every check is on everywhere else.
    config = SchemathesisConfig.from_path(CONFIG)
    schema = schemathesis.openapi.from_url(f"{short_api.url}/openapi.json", config=config)
    excepted = set()
    for found in schema.get_all_operations():
        assert isinstance(found, Ok), found  # the document loads without errors
        operation = found.ok()
        for phase in ("coverage", "fuzzing", "stateful"):
            checks = schema.config.checks_config_for(operation=operation, phase=phase)
            assert checks.negative_data_rejection.enabled, operation.label
            if not checks.positive_data_acceptance.enabled:
                excepted.add(operation.label)
    assert excepted == UNSTATABLE

    result = subprocess.run(
        [str(ST), "--config-file", str(CONFIG), "run", f"{short_api.url}/openapi.json"],
        cwd=tmp_path,  # anything it writes stays out of the working tree
        env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=900,
        preexec_fn=lowest_priority,  # the engine answers first: tritonbox_testing.priority
    )
    report = result.stdout + result.stderr
    print(report)  # the case counts and timings, for the CI log (pytest -s or a failure)
    assert result.returncode == 0, report[-12000:]
    # Every operation tested in each phase, and the stateful phase ran scenarios.
    assert re.search(r"Tested:\s+(\d+)", report) is not None
    selected = re.search(r"Operations:\s+(\d+) selected / (\d+) total", report)
    assert selected is not None and selected[1] == selected[2], report
    assert re.search(r"Scenarios:\s+[1-9]", report), report
