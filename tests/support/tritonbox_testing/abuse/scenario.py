"""Quiet blocks and attack blocks in turn, while the interactive streams run and memory is read.

Each case is sent for a block of time, after a block of the same length with no attack: the
quiet time to first token is measured beside the attacked one, block by block, so that load
from outside (other work on a shared machine) that comes and goes within a run falls on both
alike. An interactive request counts in the block it was sent in.

The hostile requests come from a process of their own, started and warmed (its imports done)
before anything is measured and run at a lower priority: on a small machine the attacker's own
CPU would otherwise count against the servers, which a real attacker's, on its own machine,
does not. What is measured is what the servers do with the requests."""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import httpx
from tritonbox_testing.abuse import stack
from tritonbox_testing.abuse.cases import CASES, Answer, Case, answer_of
from tritonbox_testing.abuse.memory import MemorySampler
from tritonbox_testing.abuse.requests import Target
from tritonbox_testing.abuse.streams import InteractiveStreams, Sample, p50

ATTACKER_NICE = 10
Span = tuple[float, float]  # time.monotonic() from, to
SETTLE_FRACTION = 0.3


@dataclass(frozen=True)
class Window:
    """One case: nothing sent during `quiet`, then the case sent again and again during
    `attack` (at least once)."""

    case: str
    quiet: Span
    attack: Span
    answers: list[Answer]


def _ready() -> int:
    return os.getpid()


def attack(target: Target, names: list[str], block_s: float) -> list[Window]:
    """Each named case in turn: `block_s` of nothing, then `block_s` of the case."""
    folders = (str(target.adapters.root), str(target.adapters.outside.parent))
    windows = []
    with httpx.Client(base_url=target.url, timeout=120) as client:
        for case in [c for c in CASES if c.name in names]:
            quiet = time.monotonic()
            time.sleep(block_s)
            start = time.monotonic()
            answers: list[Answer] = []
            sends = 0
            while not answers or time.monotonic() - start < block_s:
                if case.sends_per_s:  # the next send at its time, not before
                    time.sleep(max(0.0, start + sends / case.sends_per_s - time.monotonic()))
                answers += [answer_of(a, folders) for a in case.send(client, target)]
                sends += 1
            windows.append(Window(case.name, (quiet, start), (start, time.monotonic()), answers))
    return windows


@dataclass
class Result:
    before: Span  # warm, before the first case: the memory's baseline
    windows: list[Window]
    samples: list[Sample]
    memory: MemorySampler
    reference: dict[int, str]  # each prompt's first answer

    @property
    def quiet(self) -> list[Span]:
        return [w.quiet for w in self.windows]

    @property
    def attack(self) -> list[Span]:
        return [w.attack for w in self.windows]

    def quiet_samples(self) -> list[Sample]:
        """The interactive requests sent in a quiet block, past its first SETTLE_FRACTION (what
        the case before may have left running, a generation it was let start, ends there).

        Both phases count a request by when it was sent, however long it then waited: to count
        a quiet one only if its first token came within the block would keep the fast ones and
        drop the slow ones, and make the quiet phase look faster than it was."""
        spans = [(a + SETTLE_FRACTION * (b - a), b) for a, b in self.quiet]
        return [
            s for s in self.samples if s.ttft_s is not None
            and any(start <= s.start < end for start, end in spans)
        ]  # fmt: skip

    def attacked_samples(self, spans: list[Span] | None = None) -> list[Sample]:
        """The interactive requests sent during an attack block (or one of `spans`), however
        long their first token took."""
        return [
            s for s in self.samples if s.ttft_s is not None and any(
                start <= s.start < end for start, end in spans or self.attack
            )
        ]  # fmt: skip

    @staticmethod
    def ttft_p50(samples: list[Sample]) -> float:
        return p50([s.ttft_s for s in samples if s.ttft_s is not None])

    def wrong(self) -> list[Sample]:
        """Interactive answers that failed, or differ from the first answer to their prompt."""
        return [
            s for s in self.samples
            if s.error or s.finish_reason not in ("stop", "length")
            or s.text != self.reference[s.prompt]
        ]  # fmt: skip

    def peak(self, name: str, spans: list[Span]) -> int:
        return max((self.memory.peak(name, *span) for span in spans), default=0)


def run(
    target: Target,
    processes: dict[str, list[int] | int],
    *,
    block_s: float,
    cases: list[Case] | None = None,
) -> Result:
    """Warm up, then each case (or `cases`) after a quiet block, `block_s` each, from the
    attacker's process."""
    names = [c.name for c in cases or CASES]
    context = multiprocessing.get_context("spawn")  # no copy of this process's threads
    with (
        ProcessPoolExecutor(1, context, initializer=os.nice, initargs=(ATTACKER_NICE,)) as pool,
        MemorySampler(processes) as memory,
        InteractiveStreams(target.url, stack.secret("people"), target.model) as streams,
    ):
        pool.submit(_ready).result()  # its imports done before anything is measured
        streams.wait_for(2)
        first = {s.prompt: s for s in reversed(streams.samples)}
        reference = {prompt: sample.text for prompt, sample in first.items()}
        warm = time.monotonic()
        windows = pool.submit(attack, target, names, block_s).result()
    before = (warm, windows[0].attack[0])
    return Result(before, windows, list(streams.samples), memory, reference)
