"""Guides compiled off Triton's request thread (engine/guide_pool.py, guide_process.py): a guide
xgrammar really takes seconds over (each distinct `.{1,1000}` about 1.5 s on this machine) leaves
other requests admitted and answered meanwhile; past the time limit its request is refused naming
the guide and the limit, and its trial's process is killed at the limit and replaced, so the
next guide compiles at once, and that guide sent again is refused at once (guide_late.py);
requests with one guide share one compilation; past MAX_WAITING a request is refused at once
with a full queue's words; a compilation nobody waits for any longer never starts; one past
LOWER_AFTER_S goes on at the lowest priority; a trial past its memory bound is refused as too
large.

`Recording` sees (and gates) the compilation in the engine's process, which follows a trial
that ended in a worker process."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tritonbox_triton.engine.grammar import Guide, GuideCompiler
from tritonbox_triton.engine.guide_late import LateGuides
from tritonbox_triton.engine.guide_pool import GuidePool
from tritonbox_triton.engine.guide_process import LOWER_AFTER_S
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.words import text_decoder

EOS = 2
# 40 characters, about 6 s of xgrammar's time: each distinct bounded repetition of `.` 1.5 s.
SLOW = ("regex", "".join(f".{{1,{1000 + i}}}{'abcd'[i]}" for i in range(4)))
SLOWISH = ("regex", ".{1,1000}a.{1,1001}b")  # about 3 s, twice: a trial, then the engine's own


class Recording(GuideCompiler):
    """The real compiler, noting each compilation's start and end in `events`; a compilation
    of a guide in `gated` waits for `gate` first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[str] = []
        self.gate = threading.Event()
        self.gated: set[str] = set()
        self.nice: dict[str, int] = {}  # a gated guide's thread's nice value when let go

    def compile(self, guide_type: str, guide: str | None) -> Guide:
        self.events.append(f"compiling {guide}")
        if guide in self.gated:
            assert self.gate.wait(60)
            self.nice[guide] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        try:
            return super().compile(guide_type, guide)
        finally:
            self.events.append(f"compiled {guide}")


class Answers:
    """What a request's callbacks got, in order, with a wait for the next one."""

    def __init__(self, events: list[str], name: str) -> None:
        self.events, self.name = events, name
        self.guide: Guide | None = None
        self.refusal: str | None = None
        self.done = threading.Event()

    def ready(self, guide: Guide | None) -> None:
        self.guide = guide
        self.events.append(f"{self.name} ready")
        self.done.set()

    def refuse(self, message: str) -> None:
        self.refusal = message
        self.events.append(f"{self.name} refused")
        self.done.set()


def _until(done: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.01)


@pytest.fixture
def compiler(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> Recording:
    return Recording(tokenizer, int(model.config.vocab_size))


@pytest.fixture
def make_pool(compiler: Recording) -> Iterator[Any]:
    pools: list[GuidePool] = []

    def make(timeout_s: float = 120.0, max_waiting: int = 8, **limits: int) -> GuidePool:
        pools.append(GuidePool(compiler, timeout_s, max_waiting, **limits))  # its workers ready
        return pools[-1]

    yield make
    compiler.gate.set()
    for pool in pools:
        pool.close()


@pytest.fixture(scope="module")
def engine(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Iterator[InflightBatcher]:
    batcher = InflightBatcher(
        model, text_decoder(tokenizer), EngineLimits(256, 64, 4096), max_batch_size=4
    )
    batcher.start()
    yield batcher
    batcher.stop()


def test_a_slow_guide_leaves_a_plain_request_admitted_and_answered(
    compiler: Recording, make_pool: Any, engine: InflightBatcher, make_sink: Any
) -> None:
    pool = make_pool()
    events = compiler.events
    slow = Answers(events, "slow")
    pool.request(SLOWISH, slow.ready, slow.refuse)
    while f"compiling {SLOWISH[1]}" not in events:
        time.sleep(0.01)
    # What model.py does with a request without a guide: straight to the engine.
    plain = make_sink()
    params = SamplingParams(max_tokens=4, end_id=EOS, pad_id=EOS, temperature=0.0)

    def start(guide: Guide | None) -> None:
        engine.submit(EngineRequest([1, 504, 3458, 282], params, plain, [], []))

    pool.request(None, start, pytest.fail)
    plain.wait()
    events.append("plain answered")
    assert slow.done.wait(120) and slow.guide is not None, slow.refusal
    assert events.index("plain answered") < events.index(f"compiled {SLOWISH[1]}"), events
    assert len(plain.tokens) == 4
    # Compiled once: the next request with that guide gets it at once, on its own thread.
    again = Answers(events, "again")
    pool.request(SLOWISH, again.ready, again.refuse)
    assert again.done.is_set() and again.guide is slow.guide


def test_past_the_time_limit_the_request_is_refused_naming_the_guide_and_the_limit(
    compiler: Recording, make_pool: Any
) -> None:
    pool = make_pool(timeout_s=0.25)
    late = Answers(compiler.events, "late")
    pool.request(SLOW, late.ready, late.refuse)
    assert late.done.wait(60)
    assert late.refusal is not None and late.refusal.startswith(
        "guided_decoding_guide: the regex was not compiled within the engine's limit of 0.25 s "
        "(GUIDE_COMPILE_TIMEOUT_S)"
    )
    # Refused before its trial ended: never compiled in the engine's process.
    assert f"compiling {SLOW[1]}" not in compiler.events
    assert pool.waiting() == 0


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # a zombie (killed, not reaped) would still answer
    except ProcessLookupError:
        return True
    return False


def _nice(pid: int) -> set[int]:
    """The nice value of each of a process's threads (/proc/PID/task/TID/stat's 19th field)."""
    tasks = Path(f"/proc/{pid}/task").glob("*")
    return {int((task / "stat").read_text().rsplit(")", 1)[1].split()[16]) for task in tasks}


def test_a_trial_past_the_limit_is_killed_and_the_next_guide_compiles_at_once(
    compiler: Recording, make_pool: Any
) -> None:
    """The slow guide's trial (about 6 s of xgrammar's time) runs in a worker's process: at nice
    19 past LOWER_AFTER_S, killed at the 1.5 s limit. Its request is refused; the process is
    gone (reaped, not a zombie) and a new one holds its place, so no compilation outlives the
    limit, and a cheap guide sent next compiles in milliseconds."""
    pool = make_pool(timeout_s=1.5)
    before = set(pool.pids())
    assert len(before) == 2 and not any(_gone(pid) for pid in before)
    late = Answers(compiler.events, "late")
    pool.request(SLOW, late.ready, late.refuse)
    _until(lambda: pool.running() == 1)
    time.sleep(LOWER_AFTER_S + 0.3)
    assert {19} in [_nice(pid) for pid in before], "the trial's process was not lowered"
    assert late.done.wait(60) and late.refusal is not None
    assert "limit of 1.5 s (GUIDE_COMPILE_TIMEOUT_S)" in late.refusal
    _until(lambda: len(set(pool.pids()) - before) == 1, timeout_s=30)  # a new one in its place
    (killed,) = before - set(pool.pids())
    assert _gone(killed)
    assert pool.running() == 0 and f"compiling {SLOW[1]}" not in compiler.events
    started = time.monotonic()
    cheap = Answers(compiler.events, "cheap")
    pool.request(("regex", "[0-9]+z"), cheap.ready, cheap.refuse)
    assert cheap.done.wait(60) and cheap.guide is not None, cheap.refusal
    assert time.monotonic() - started < 1.0


def test_a_guide_past_the_limit_is_remembered_and_refused_at_once_when_sent_again(
    compiler: Recording, make_pool: Any
) -> None:
    """Sent again, a guide whose trial was killed at the limit is refused on the request's own
    thread with the same words: no new trial, no worker's process killed for it."""
    pool = make_pool(timeout_s=1.0)
    before = set(pool.pids())
    first = Answers(compiler.events, "first")
    pool.request(SLOW, first.ready, first.refuse)
    assert first.done.wait(60) and first.refusal is not None
    _until(lambda: len(set(pool.pids()) - before) == 1, timeout_s=30)  # its worker's new process
    pids = pool.pids()
    started = time.monotonic()
    again = Answers(compiler.events, "again")
    pool.request(SLOW, again.ready, again.refuse)
    assert again.done.is_set() and time.monotonic() - started < 0.2
    assert again.refusal == first.refusal
    assert "limit of 1 s (GUIDE_COMPILE_TIMEOUT_S)" in again.refusal
    assert pool.waiting() == 0 and pool.running() == 0
    time.sleep(0.3)  # time for a wrongly started trial to show
    assert pool.running() == 0 and pool.pids() == pids


def test_the_late_guides_kept_are_the_last_sent() -> None:
    late = LateGuides(kept=2)
    late.add(("regex", "a"))
    late.add(("regex", "b"))
    assert ("regex", "a") in late  # sent again: now the most recent
    late.add(("json_schema", "c"))
    assert ("regex", "b") not in late and ("regex", "a") in late and ("json_schema", "c") in late
    assert ("json_schema", "a") not in late  # the type is part of the key


def test_a_trial_past_its_memory_bound_is_refused_as_too_large(
    compiler: Recording, make_pool: Any
) -> None:
    """xgrammar's std::bad_alloc under the worker's RLIMIT_AS (16 MiB past its start here) is a
    refusal naming the bound; the worker goes on."""
    pool = make_pool(memory_bytes=16 << 20)
    pids = pool.pids()
    alternatives = "(" + "|".join(f"w{i}x" for i in range(15_000)) + ")"  # ~25 MB to compile
    large = Answers(compiler.events, "large")
    pool.request(("regex", alternatives), large.ready, large.refuse)
    assert large.done.wait(60) and large.refusal == (
        "guided_decoding_guide: compiling the regex needs more than the engine's 16 MiB "
        "(guide_process.MEMORY_BYTES); a simpler one needs less"
    )
    cheap = Answers(compiler.events, "cheap")
    pool.request(("regex", "[0-9]+y"), cheap.ready, cheap.refuse)
    assert cheap.done.wait(60) and cheap.guide is not None, cheap.refusal
    assert pool.pids() == pids


def test_requests_with_one_guide_share_one_compilation(compiler: Recording, make_pool: Any) -> None:
    pool = make_pool()
    compiler.gated.add("[0-9]+x")
    answers = [Answers(compiler.events, f"r{i}") for i in range(3)]
    for answer in answers:
        pool.request(("regex", "[0-9]+x"), answer.ready, answer.refuse)
    assert pool.waiting() == 3
    compiler.gate.set()
    for answer in answers:
        assert answer.done.wait(60) and answer.guide is not None
    assert compiler.events.count("compiling [0-9]+x") == 1
    assert len({id(answer.guide) for answer in answers}) == 1


def test_past_max_waiting_a_request_is_refused_at_once_as_a_full_queue(
    compiler: Recording, make_pool: Any
) -> None:
    pool = make_pool(max_waiting=2)
    compiler.gated.update({"a+", "b+", "c+"})
    first, second, third = (Answers(compiler.events, name) for name in "abc")
    pool.request(("regex", "a+"), first.ready, first.refuse)
    pool.request(("regex", "b+"), second.ready, second.refuse)
    pool.request(("regex", "c+"), third.ready, third.refuse)
    assert third.done.is_set() and third.refusal == (
        "guided_decoding_guide: Maximum queue size of 2 requests waiting for a guide to compile "
        "has been reached, please try again later"
    )
    compiler.gate.set()
    assert first.done.wait(60) and second.done.wait(60)
    assert first.guide is not None and second.guide is not None
    assert "compiling c+" not in compiler.events


def test_a_compilation_nobody_waits_for_never_starts(compiler: Recording, make_pool: Any) -> None:
    """Both workers held by gated guides (compiling in the engine's process once their trials
    ended): a third guide waits behind them, expires, and its compilation is dropped rather than
    run for nobody."""
    pool = make_pool(timeout_s=0.3)
    compiler.gated.update({"a+", "b+"})
    held = [Answers(compiler.events, name) for name in "ab"]
    pool.request(("regex", "a+"), held[0].ready, held[0].refuse)
    pool.request(("regex", "b+"), held[1].ready, held[1].refuse)
    queued = Answers(compiler.events, "queued")
    pool.request(("regex", "q+"), queued.ready, queued.refuse)
    assert queued.done.wait(60) and queued.refusal is not None
    compiler.gate.set()
    time.sleep(0.5)  # time for a wrongly kept compilation of q+ to start
    assert "compiling q+" not in compiler.events
    assert pool.waiting() == 0


def test_a_compilation_past_its_requests_limit_goes_on_and_is_cached(
    compiler: Recording, make_pool: Any
) -> None:
    """A guide whose trial ended is compiled in the engine's process even when its requests
    were refused meanwhile (the trial showed it ends): sent again once done, it is served at
    once."""
    pool = make_pool(timeout_s=0.3)
    compiler.gated.add("a+")
    held = Answers(compiler.events, "a")
    pool.request(("regex", "a+"), held.ready, held.refuse)
    assert held.done.wait(60) and held.refusal is not None
    assert pool.running() == 1
    compiler.gate.set()
    _until(lambda: pool.running() == 0)
    again = Answers(compiler.events, "again")
    pool.request(("regex", "a+"), again.ready, again.refuse)
    assert again.done.is_set() and again.guide is not None
    assert compiler.events.count("compiling a+") == 1


def test_a_compilation_past_lower_after_s_goes_on_lowered_and_is_served(
    compiler: Recording, make_pool: Any
) -> None:
    pool = make_pool(timeout_s=60.0)
    compiler.gated.add("d+")
    answer = Answers(compiler.events, "d")
    pool.request(("regex", "d+"), answer.ready, answer.refuse)
    time.sleep(LOWER_AFTER_S + 0.3)
    compiler.gate.set()
    assert answer.done.wait(60) and answer.guide is not None, answer.refusal
    assert compiler.nice == {"d+": 19}
    assert pool.running() == 0


def test_a_request_whose_start_fails_is_refused_not_left_unanswered(make_pool: Any) -> None:
    pool = make_pool()
    answer = Answers([], "broken")

    def start(guide: Guide | None) -> None:
        raise RuntimeError("the engine stopped")

    pool.request(None, start, answer.refuse)
    assert answer.refusal == "the engine could not take the request: the engine stopped"
