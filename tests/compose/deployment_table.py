"""What scripts/test_compose measures, and its table in docs/deployment.md (between markers)."""

from __future__ import annotations

import datetime
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path

BEGIN = "<!-- compose-benchmark:begin (written by scripts/test_compose --write-docs) -->"
END = "<!-- compose-benchmark:end -->"


@dataclass
class Measured:
    engine: str = "?"
    compose: str = "?"
    base: str = "?"
    build_s: dict[str, float] = field(default_factory=dict)
    size_mb: dict[str, float] = field(default_factory=dict)
    memory: dict[str, str] = field(default_factory=dict)
    cold_s: float = 0.0
    warm_s: float = 0.0
    total_s: float = 0.0
    # The PostgreSQL phase (compose.postgres.yaml, API_WORKERS=4; tests/compose/postgres.py).
    postgres_image: str = "?"
    postgres_up_s: float = 0.0
    postgres_s: float = 0.0
    postgres_memory: dict[str, str] = field(default_factory=dict)

    def set(self, name: str, seconds: float) -> str:
        setattr(self, name, seconds)
        return f"{seconds:.0f} s"

    def summary(self) -> str:
        builds = ", ".join(f"{s} {t:.0f} s" for s, t in self.build_s.items())
        sizes = ", ".join(f"{s} {m:.0f} MB" for s, m in self.size_mb.items())
        return (
            f"builds: {builds or '-'}\nimages: {sizes or '-'}\n"
            f"start to healthy: cold {self.cold_s:.0f} s, warm {self.warm_s:.0f} s\n"
            f"memory: {', '.join(f'{s} {m}' for s, m in self.memory.items()) or '-'}\n"
            f"PostgreSQL phase: {self.postgres_s:.0f} s (up {self.postgres_up_s:.0f} s), "
            f"{self.postgres_image}; memory: {_listed(self.postgres_memory)}\n"
            f"scripts/test_compose wall time: {self.total_s:.0f} s"
        )


def table(m: Measured) -> str:
    rows = [
        "| | triton (cpu) | api | playground |",
        "|---|---|---|---|",
        "| build (s) | " + " | ".join(f"{m.build_s.get(s, 0):.0f}" for s in _SERVICES) + " |",
        "| image size (MB) | " + " | ".join(f"{m.size_mb.get(s, 0):.0f}" for s in _SERVICES) + " |",
        "| memory after the checks | " + " | ".join(m.memory.get(s, "-") for s in _SERVICES) + " |",
    ]
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cpus = os.cpu_count()
    return "\n".join(
        [
            BEGIN,
            f"Measured {when} by `scripts/test_compose` on {cpus} CPU cores "
            f"({platform.machine()}), {m.engine}, Docker Compose {m.compose}, classic builder.",
            f"Base image: {m.base}.",
            "",
            *rows,
            "",
            f"Start to healthy (`up --wait`, all three services): cold {m.cold_s:.0f} s "
            f"(first start: the default model is prepared into the cache volume), warm "
            f"{m.warm_s:.0f} s (`down` then `up`, volumes kept). Whole test: {m.total_s:.0f} s.",
            f"With `compose.postgres.yaml` and `API_WORKERS=4` on top (the same images, PostgreSQL "
            f"added): start to healthy {m.postgres_up_s:.0f} s, the whole phase "
            f"{m.postgres_s:.0f} s, memory {_listed(m.postgres_memory)}; "
            f"PostgreSQL image: {m.postgres_image}.",
            "Build times are those of this run: with Docker's layer cache from an earlier run "
            "they are seconds, without it (a fresh engine) the dependency stages dominate.",
            END,
        ]
    )


_SERVICES = ("triton", "api", "playground")


def _listed(memory: dict[str, str]) -> str:
    return ", ".join(f"{s} {m}" for s, m in memory.items()) or "-"


def write_benchmark(m: Measured, doc: Path) -> None:
    text = doc.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise RuntimeError(f"{doc} has no {BEGIN} ... {END} section")
    doc.write_text(pattern.sub(lambda _: table(m), text))
