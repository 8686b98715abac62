"""Guides compiled off Triton's request thread (engine/guide_pool.py): a guide xgrammar really
takes seconds over (four distinct `.{1,1000}`: about 6 s on this machine) leaves other requests
admitted and answered meanwhile; past the time limit its request is refused naming the guide and
the limit; requests with one guide share one compilation; past MAX_WAITING a request is refused
at once with a full queue's words; a compilation nobody waits for any longer never starts; one
past LOWER_AFTER_S goes on at the lowest priority, and one past its time limit gives its place
to the next guide."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tritonbox_triton.engine.grammar import Guide, GuideCompiler
from tritonbox_triton.engine.guide_pool import LOWER_AFTER_S, GuidePool
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.words import text_decoder

EOS = 2
# 40 characters, seconds of xgrammar's time: each distinct bounded repetition of `.` about 1.5 s.
SLOW = ("regex", "".join(f".{{1,{1000 + i}}}{'abcd'[i]}" for i in range(4)))


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
        pools.append(GuidePool(compiler, timeout_s, max_waiting, **limits))
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
    pool.request(SLOW, slow.ready, slow.refuse)
    while f"compiling {SLOW[1]}" not in events:
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
    assert events.index("plain answered") < events.index(f"compiled {SLOW[1]}"), events
    assert len(plain.tokens) == 4
    # Compiled once: the next request with that guide gets it at once, on its own thread.
    again = Answers(events, "again")
    pool.request(SLOW, again.ready, again.refuse)
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
    # Refused while xgrammar still compiled it (it cannot be interrupted); the pool lets go.
    assert f"compiled {SLOW[1]}" not in compiler.events
    assert pool.waiting() == 0


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
    """Both workers held by gated guides (none may leave its place past its time): a third
    guide waits behind them, expires, and its compilation is dropped rather than run for
    nobody."""
    pool = make_pool(timeout_s=0.3, max_overdue=0)
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


def test_a_compilation_past_its_time_goes_on_lowered_and_gives_its_place(
    compiler: Recording, make_pool: Any
) -> None:
    """Two gated guides outlast the limit: their requests are refused; one leaves its place to
    the next guide (MAX_OVERDUE 1 here), the other keeps it; both go on at nice 19 and are
    cached when done, so the same guide sent again is served at once."""
    pool = make_pool(timeout_s=0.3, max_overdue=1)
    compiler.gated.update({"a+", "b+"})
    held = [Answers(compiler.events, name) for name in "ab"]
    pool.request(("regex", "a+"), held[0].ready, held[0].refuse)
    pool.request(("regex", "b+"), held[1].ready, held[1].refuse)
    assert all(answer.done.wait(60) and answer.refusal for answer in held)
    _until(lambda: pool.running() == (1, 1))  # the compilations' own deadlines come just after
    fresh = Answers(compiler.events, "fresh")
    pool.request(("regex", "c+"), fresh.ready, fresh.refuse)
    assert fresh.done.wait(60) and fresh.guide is not None, fresh.refusal
    compiler.gate.set()
    _until(lambda: pool.running() == (0, 0))
    assert compiler.nice == {"a+": 19, "b+": 19}
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
    assert pool.running() == (0, 0)


def test_a_request_whose_start_fails_is_refused_not_left_unanswered(make_pool: Any) -> None:
    pool = make_pool()
    answer = Answers([], "broken")

    def start(guide: Guide | None) -> None:
        raise RuntimeError("the engine stopped")

    pool.request(None, start, answer.refuse)
    assert answer.refusal == "the engine could not take the request: the engine stopped"
