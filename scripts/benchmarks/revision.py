"""The commit a benchmark measured, for its page."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def revision() -> str:
    """The short commit, and whether the server's files (triton/) differed from it: a page
    measured on work in progress says so."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    changed = subprocess.run([*git, "status", "--porcelain", "triton/"], capture_output=True)
    dirty = " with uncommitted changes under triton/" if changed.stdout.strip() else ""
    return f"{head.stdout.strip() or 'unknown'}{dirty}"
