"""The repository's scripts (`scripts/…`), imported from a test."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[3]


def script_module(name: str) -> ModuleType:
    """`name` (`scripts.benchmarks.…`) imported with the repository's root on sys.path for this
    import only: the scripts import each other as `scripts.…`, and the root's `triton/` folder
    would pass for the `triton` package later (a test that imports peft, whose torch looks for
    that package, imports it first)."""
    sys.path.append(str(REPO))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO))
