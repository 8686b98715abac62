"""prepare_model with real parts: a small GGUF written here, prepared by real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tritonbox_testing.tiny_gguf import write_tiny_gguf

from tritonbox_triton.prepare_model import MARKER

PREPARE = "import sys; from pathlib import Path; from tritonbox_triton.prepare_model import " \
    "prepare_gguf; prepare_gguf(Path(sys.argv[1]), Path(sys.argv[2]))"  # fmt: skip


def test_two_processes_preparing_one_folder_leave_a_whole_model(tmp_path: Path) -> None:
    """Two test sessions (or two containers on one cache volume) at once: each builds its own
    staging folder, the first to finish wins, and the folder holds one whole checkpoint."""
    source = tmp_path / "tiny-llama.gguf"
    write_tiny_gguf(source)
    target = tmp_path / "models" / "tiny"
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    command = [sys.executable, "-c", PREPARE, str(source), str(target)]
    runs = [subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) for _ in "ab"]
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-2000:]
    files = {path.name for path in target.iterdir()}
    assert {MARKER, "config.json", "model.safetensors", "tokenizer.json"} <= files, files
    assert [path.name for path in target.parent.iterdir()] == ["tiny"]  # no staging left over
    assert oct(target.stat().st_mode & 0o777) == oct(0o755)
