"""The in-flight batcher with the real default model, in-process (the Triton glue is tested
against the real server under tests/triton/server).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from tritonbox_testing.reference import (
    assert_greedy_as_generate,
    chat_ids,
    greedy_generate,
    greedy_ids,
)

from tritonbox_common.word_lists import decode_word_list, encode_word_list
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineFinish, EngineRequest, InflightBatcher
from tritonbox_triton.engine.stats import IterationStats
from tritonbox_triton.engine.words import text_decoder

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three colors.",
    "Why is the sky blue?",
]
EOS = 2
# Questions a short answer ends, for the tests of what ends an answer: bfloat16 rounds by CPU,
# and the model's answer with it ("What is the capital of France?" is answered "Paris" on the
# AMX machine, with a list that runs on by an AMD EPYC's AVX-512 kernels), so the first whose
# answer ends here is taken.
SHORT_QUESTIONS = [
    "Which city is the capital of France?",
    "What is the capital of France?",
    "What is the capital of Germany?",
    "What is 2+2?",
]


def reference(
    model: PreTrainedModel, prompt: list[int], max_tokens: int, **kwargs: Any
) -> list[int]:
    """transformers' generate() on the same checkpoint: the result the engine must reproduce."""
    return greedy_ids(model, prompt, max_tokens, EOS, **kwargs)


@pytest.fixture(scope="module")
def engine(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Iterator[InflightBatcher]:
    batcher = InflightBatcher(
        model, text_decoder(tokenizer), EngineLimits(256, 128, 4096), max_batch_size=8
    )
    batcher.start()
    yield batcher
    batcher.stop()


@pytest.fixture(scope="module")
def short_answer(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> tuple[list[int], list[int], str]:
    """A prompt generate() answers in under 15 tokens, then the end id; the answer's ids (no
    end id) and its last word."""
    for question in SHORT_QUESTIONS:
        prompt = chat_ids(tokenizer, question)
        answer, _ = greedy_generate(model, prompt, 15)
        if answer and answer[-1] == EOS:
            words = str(tokenizer.decode(answer[:-1])).replace(".", " ").split()
            return prompt, answer[:-1], words[-1]
    pytest.fail(f"none of {SHORT_QUESTIONS} is answered in under 15 tokens on this machine")


def submit(
    engine: InflightBatcher,
    sink: Any,
    prompt: list[int],
    *,
    stop: list[list[int]] | None = None,
    bad: list[list[int]] | None = None,
    **params: Any,
) -> Any:
    settings = {"max_tokens": 24, "end_id": EOS, "pad_id": EOS, "temperature": 0.0, **params}
    engine.submit(
        EngineRequest(
            prompt=prompt,
            params=SamplingParams(**settings),
            sink=sink,
            stop_words=stop or [],
            bad_words=bad or [],
        )
    )
    return sink


def test_greedy_batch_matches_generate_token_for_token(
    engine: InflightBatcher,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    make_sink: Any,
) -> None:
    prompts = [chat_ids(tokenizer, text) for text in PROMPTS]
    sinks = []
    for prompt in prompts:  # staggered, so requests join a batch that is already decoding
        sinks.append(submit(engine, make_sink(), prompt))
        time.sleep(0.15)
    for prompt, sink in zip(prompts, sinks, strict=True):
        assert_greedy_as_generate(model, prompt, sink.wait().tokens, 24, EOS)
        assert sink.finish in (EngineFinish.STOP, EngineFinish.LENGTH)


def test_mixed_batch_honours_each_requests_sampling(
    engine: InflightBatcher,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    make_sink: Any,
) -> None:
    prompt = chat_ids(tokenizer, "Tell me a story about a dragon.")
    sampled: dict[str, Any] = {"temperature": 1.2, "top_k": 100, "top_p": 0.95, "max_tokens": 20}
    greedy = submit(engine, make_sink(), prompt, max_tokens=20)
    seeded_a = submit(engine, make_sink(), prompt, seed=1234, **sampled)
    seeded_b = submit(engine, make_sink(), prompt, seed=1234, **sampled)
    other_seed = submit(engine, make_sink(), prompt, seed=99, **sampled)
    penalised = submit(engine, make_sink(), prompt, max_tokens=20, repetition_penalty=1.5)
    for sink in (greedy, seeded_a, seeded_b, other_seed, penalised):
        sink.wait()
    assert greedy.tokens == reference(model, prompt, 20)
    assert penalised.tokens == reference(model, prompt, 20, repetition_penalty=1.5)
    assert seeded_a.tokens == seeded_b.tokens  # same seed, same batch: same tokens
    assert seeded_a.tokens != greedy.tokens
    assert seeded_a.tokens != other_seed.tokens


def test_min_tokens_holds_back_the_end_id(
    engine: InflightBatcher, short_answer: tuple[list[int], list[int], str], make_sink: Any
) -> None:
    prompt, _, _ = short_answer
    short = submit(engine, make_sink(), prompt, max_tokens=40, return_log_probs=True).wait()
    assert short.finish is EngineFinish.STOP and len(short.tokens) < 15
    # The end token is sent too, with its log-prob (OpenAI's and vLLM's log-probs have it).
    assert short.tokens[-1] == EOS and EOS not in short.tokens[:-1]
    assert len(short.logprobs) == len(short.tokens) and short.logprobs[-1] < 0
    longer = submit(engine, make_sink(), prompt, max_tokens=40, min_tokens=15).wait()
    assert len(longer.tokens) >= 15
    # The end id only after the 15 (where it ends the answer, sent as its last token).
    assert EOS not in longer.tokens[:15] and EOS not in longer.tokens[:-1]


def test_end_id_minus_one_never_ends(
    engine: InflightBatcher, short_answer: tuple[list[int], list[int], str], make_sink: Any
) -> None:
    """TensorRT-LLM's end_id -1 (its `ignore_eos`): only max_tokens ends it, min_tokens too."""
    prompt, _, _ = short_answer
    short = submit(engine, make_sink(), prompt, max_tokens=40).wait()
    assert short.finish is EngineFinish.STOP and len(short.tokens) < 40
    extras: list[dict[str, Any]] = [{}, {"min_tokens": 5}]
    for extra in extras:
        endless = submit(engine, make_sink(), prompt, max_tokens=40, end_id=-1, **extra).wait()
        assert endless.finish is EngineFinish.LENGTH and len(endless.tokens) == 40
        # Greedy: the same answer up to where it ended, the end id then just a token.
        assert endless.tokens[: len(short.tokens)] == short.tokens and short.tokens[-1] == EOS


def test_top_logprobs_are_sorted_and_lead_with_the_greedy_choice(
    engine: InflightBatcher, tokenizer: PreTrainedTokenizerBase, make_sink: Any
) -> None:
    prompt = chat_ids(tokenizer, PROMPTS[0])
    plain = submit(engine, make_sink(), prompt, max_tokens=8, return_log_probs=True).wait()
    assert plain.top == []  # none asked for, none computed
    ranked = submit(engine, make_sink(), prompt, max_tokens=8, num_top_logprobs=4).wait()
    assert ranked.tokens == plain.tokens and ranked.logprobs == plain.logprobs
    assert len(ranked.top) == len(ranked.tokens)
    for token, logprob, (ids, values) in zip(
        ranked.tokens, ranked.logprobs, ranked.top, strict=True
    ):
        assert len(ids) == len(values) == 4 and values == sorted(values, reverse=True)
        assert ids[0] == token and values[0] == logprob


def test_max_tokens_ends_with_length(
    engine: InflightBatcher, tokenizer: PreTrainedTokenizerBase, make_sink: Any
) -> None:
    sink = submit(engine, make_sink(), chat_ids(tokenizer, PROMPTS[3]), max_tokens=5).wait()
    assert len(sink.tokens) == 5
    assert sink.finish is EngineFinish.LENGTH


def test_stop_word_ends_generation(
    engine: InflightBatcher,
    tokenizer: PreTrainedTokenizerBase,
    short_answer: tuple[list[int], list[int], str],
    make_sink: Any,
) -> None:
    prompt, _, word = short_answer  # the answer's last word, such as "Paris"
    stop = decode_word_list(encode_word_list(tokenizer, [word]))
    sink = submit(engine, make_sink(), prompt, stop=stop).wait()
    assert sink.finish is EngineFinish.STOP_WORD
    assert text_decoder(tokenizer)(sink.tokens).endswith(word)


def test_bad_word_never_appears(
    engine: InflightBatcher,
    tokenizer: PreTrainedTokenizerBase,
    short_answer: tuple[list[int], list[int], str],
    make_sink: Any,
) -> None:
    prompt, _, word = short_answer
    bad = decode_word_list(encode_word_list(tokenizer, [word]))
    sink = submit(engine, make_sink(), prompt, bad=bad, max_tokens=30).wait()
    text = tokenizer.decode(sink.tokens)
    assert word not in text
    assert text  # it still answered


def test_cancelled_request_stops_within_one_step(
    engine: InflightBatcher, tokenizer: PreTrainedTokenizerBase, make_sink: Any
) -> None:
    prompt = chat_ids(tokenizer, PROMPTS[1])
    neighbour = submit(engine, make_sink(), prompt, max_tokens=30)
    cancelled = submit(engine, make_sink(cancel_after=3), prompt, max_tokens=100)
    cancelled.wait()
    neighbour.wait()
    assert cancelled.cancelled
    assert cancelled.finish is None
    # No token was produced after the engine saw the cancellation (it asks the client every
    # cancel_check_s, not every step: each question is a round trip to Triton).
    assert len(cancelled.tokens) == cancelled.tokens_when_cancel_seen
    assert 3 <= len(cancelled.tokens) < 30
    assert neighbour.finish is not None and len(neighbour.tokens) > 3


class Recorder:
    """An EngineObserver keeping every iteration's stats."""

    def __init__(self) -> None:
        self.stats: list[IterationStats] = []

    def on_iteration(self, stats: IterationStats) -> None:
        self.stats.append(stats)

    def on_tokens(self, count: int) -> None:
        pass

    def on_finished(self, outcome: str) -> None:
        pass


def admitted(recorder: Recorder) -> None:
    """Wait until a request runs in the batch."""
    deadline = time.monotonic() + 30
    while not (recorder.stats and recorder.stats[-1].active):
        assert time.monotonic() < deadline, "nothing was admitted"
        time.sleep(0.01)


@pytest.fixture
def one_slot(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Iterator[Any]:
    """An engine with one batch slot and room for one waiting request."""
    recorder = Recorder()
    batcher = InflightBatcher(
        model,
        text_decoder(tokenizer),
        EngineLimits(256, 128, 4096),
        max_batch_size=1,
        max_queue_size=1,
        observer=recorder,
    )
    batcher.start()
    yield batcher, recorder
    batcher.stop()


def test_queue_is_bounded_by_max_queue_size(
    one_slot: Any, tokenizer: PreTrainedTokenizerBase, make_sink: Any
) -> None:
    engine, recorder = one_slot
    prompt = chat_ids(tokenizer, PROMPTS[1])
    running = submit(engine, make_sink(), prompt, max_tokens=100, min_tokens=100)
    admitted(recorder)  # the queue is empty again
    waiting = submit(engine, make_sink(), prompt, max_tokens=5)
    refused = submit(engine, make_sink(), prompt, max_tokens=5).wait(5)
    assert refused.error == "Maximum queue size of 1 has been reached, please try again later"
    assert not refused.tokens
    assert waiting.error is None and not waiting.done.is_set()
    engine.stop_request("")  # an unknown id stops nothing
    running.wait()
    assert len(waiting.wait().tokens) == 5


def test_a_stop_for_a_waiting_request_cancels_it_at_once(
    one_slot: Any, tokenizer: PreTrainedTokenizerBase, make_sink: Any
) -> None:
    engine, recorder = one_slot
    prompt = chat_ids(tokenizer, PROMPTS[1])
    running = submit(engine, make_sink(), prompt, max_tokens=100, min_tokens=100)
    admitted(recorder)
    sink = make_sink()
    engine.submit(
        EngineRequest(
            prompt=prompt,
            params=SamplingParams(max_tokens=5, end_id=EOS, pad_id=EOS),
            sink=sink,
            stop_words=[],
            bad_words=[],
            request_id="queued",
        )
    )
    engine.stop_request("queued")
    # Cancelled before the running request ends, not when it would have been admitted.
    assert sink.wait(1).cancelled and not sink.tokens
    assert not running.done.is_set()
    engine.stop_request("queued")  # a second stop for a request already gone is harmless
    running.wait()
    assert recorder.stats[-1].waiting == 0


def test_iteration_stats_show_active_requests_fall_when_cancelled(
    one_slot: Any, tokenizer: PreTrainedTokenizerBase, make_sink: Any
) -> None:
    engine, recorder = one_slot
    prompt = chat_ids(tokenizer, PROMPTS[1])
    sink = make_sink(cancel_after=5)
    submit(engine, sink, prompt, max_tokens=100, min_tokens=100)
    sink.wait()
    time.sleep(0.2)  # the idle loop reports again
    actives = [stats.active for stats in recorder.stats]
    assert 1 in actives and actives[-1] == 0
    busy = next(stats for stats in recorder.stats if stats.context)
    assert busy.context_tokens == len(prompt) and busy.max_active == 1
    assert busy.kv_tokens_used >= len(prompt)
    assert [s.iteration for s in recorder.stats] == list(range(1, len(recorder.stats) + 1))


def test_a_stop_that_comes_during_a_prefill_acts_before_the_step(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, make_sink: Any
) -> None:
    """A running request stopped while another is prefilled (the api stops batch lines as a live
    request comes) gets no token from the step after that prefill: it leaves before it."""
    # Not started: its iterations are run here, one at a time.
    limits = EngineLimits(256, 128, 4096)
    batcher = InflightBatcher(model, text_decoder(tokenizer), limits, max_batch_size=4)
    prompt = chat_ids(tokenizer, PROMPTS[1])
    line = make_sink()
    params = SamplingParams(max_tokens=50, min_tokens=50, end_id=EOS, pad_id=EOS)
    batcher.submit(EngineRequest(prompt, params, line, [], [], request_id="line"))
    batcher.run_once()  # the line prefilled and one step: two tokens
    had = len(line.tokens)

    class StopsTheLine(make_sink):  # type: ignore[misc]
        def on_tokens(self, *args: Any, **kwargs: Any) -> None:
            batcher.stop_request("line")  # as its first token leaves the prefill
            super().on_tokens(*args, **kwargs)

    live = StopsTheLine()
    batcher.submit(EngineRequest(prompt, params, live, [], [], request_id="live"))
    batcher.run_once()
    assert line.cancelled and len(line.tokens) == had
    assert len(live.tokens) == 2  # its first token, and the step's
    batcher.stop()


def test_the_engine_thread_uses_every_core_whatever_its_starter_set(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, make_sink: Any
) -> None:
    """threads=0 is every core this process may use. A thread started after its starter's
    torch.set_num_threads(1) (as the in-process benchmarks do, leaving the work to the engine)
    inherits 1 otherwise: a 260-token prefill took 336 ms instead of 176 on 2 cores."""
    seen: list[int] = []

    class Records(make_sink):  # type: ignore[misc]
        def on_tokens(self, *args: Any, **kwargs: Any) -> None:
            seen.append(torch.get_num_threads())  # on the engine's thread
            super().on_tokens(*args, **kwargs)

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    limits = EngineLimits(256, 128, 4096)
    batcher = InflightBatcher(model, text_decoder(tokenizer), limits, max_batch_size=2)
    try:
        batcher.start()
        sink = submit(batcher, Records(), chat_ids(tokenizer, PROMPTS[2]), max_tokens=2)
        assert sink.done.wait(60)
    finally:
        batcher.stop()
        torch.set_num_threads(before)
    assert seen and set(seen) == {len(os.sched_getaffinity(0))}
