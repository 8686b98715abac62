"""NVIDIA's aiperf benchmark client against the live api's chat route, streamed.

aiperf is a client nobody here wrote: it must work with no workaround beyond naming the
tokenizer's folder (`--tokenizer`). It has heavy dependencies of its own (1.2 GB, torch-free but
with its own transformers), so it lives in a venv outside the project, made once per machine
under ~/.cache/tritonbox and reused by every later run (docs/testing.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tritonbox_testing.api_process import RunningApi
from tritonbox_testing.priority import lowest_priority

from tritonbox_triton.settings import DEFAULT_MODEL_NAME

VERSION = "0.13.0"
VENV = Path(
    os.environ.get("TRITONBOX_AIPERF_VENV", Path.home() / ".cache/tritonbox" / f"aiperf-{VERSION}")
)
AIPERF = VENV / "bin" / "aiperf"
TOKENIZER = Path(__file__).resolve().parents[3] / ".cache" / "models" / DEFAULT_MODEL_NAME
REQUESTS = 8


def _install() -> None:
    """aiperf into its own venv, once; a registry that cannot be reached is a visible skip
    (listed by `pytest -ra` with pip's words), never a silent one."""
    if AIPERF.exists():
        return
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [str(VENV / "bin" / "pip"), "install", "--quiet", "--retries", "3",
             f"aiperf=={VERSION}"],
            check=True, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        AIPERF.unlink(missing_ok=True)  # a half-made venv is made again next time
        output = getattr(error, "stderr", "") or ""
        pytest.skip(f"aiperf {VERSION} could not be installed into {VENV}: {output[-2000:]}")


def test_aiperf_profiles_the_chat_route(api_server: RunningApi, tmp_path: Path) -> None:
    _install()
    # aiperf 0.13's offline mode takes a local tokenizer folder for a hub repo id and fails
    # (HFValidationError); online, a local folder is read from disk with no network at all.
    offline = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    env = {key: value for key, value in os.environ.items() if key not in offline}
    command = [
        str(AIPERF), "profile",
        "--model", DEFAULT_MODEL_NAME,
        "--url", api_server.url,
        "--endpoint-type", "chat",
        "--streaming",
        "--tokenizer", str(TOKENIZER),
        "--request-count", str(REQUESTS),
        "--concurrency", "2",
        "--synthetic-input-tokens-mean", "32",
        "--output-tokens-mean", "16",
        "--ui-type", "none",
        # Its own processes compete with the cpu engine for the machine's cores: as few as it
        # can run with, and no GPU telemetry to poll (it still scrapes the api's /metrics).
        "--workers-max", "1",
        "--record-processors", "1",
        "--no-gpu-telemetry",
        "--artifact-dir", str(tmp_path / "aiperf"),
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
        preexec_fn=lowest_priority,  # its timing manager spins a core: tritonbox_testing.priority
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    export: dict[str, Any] = json.loads(
        (tmp_path / "aiperf" / "profile_export_aiperf.json").read_text()
    )
    print((tmp_path / "aiperf" / "profile_export_console.txt").read_text())  # for the CI log
    assert export["error_summary"] == [], export["error_summary"]
    assert export["request_count"]["avg"] == REQUESTS
    assert export["request_error_rate"]["avg"] == 0
    assert export["was_cancelled"] is False
    # Every answer streamed tokens, at most the 16 asked for (the model may end one sooner).
    assert 0 < export["output_sequence_length"]["min"] <= export["output_sequence_length"]["max"]
    assert export["output_sequence_length"]["max"] <= 16
