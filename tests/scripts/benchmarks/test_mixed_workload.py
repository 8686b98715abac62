"""The open-loop benchmark's requests (scripts/benchmarks/mixed_workload.py) under the default
model's real tokenizer: seeded, lengths in range and exact, the shared system prompt really
shared, Poisson gaps; no server."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tritonbox_testing.repo_scripts import script_module

from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.settings import DEFAULT_MODEL_NAME

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def workload() -> ModuleType:
    return script_module("scripts.benchmarks.mixed_workload")


@pytest.fixture(scope="module")
def tokenizer() -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    from transformers import AutoTokenizer

    folder = prepare_default_model(REPO / ".cache" / "models" / DEFAULT_MODEL_NAME)
    tok: Any = AutoTokenizer.from_pretrained(folder)
    return (lambda text: list(tok(text)["input_ids"])), (lambda ids: str(tok.decode(ids)))


def test_seeded_requests_are_the_same_for_every_server_and_differ_by_seed(
    workload: ModuleType, tokenizer: Any
) -> None:
    encode, decode = tokenizer
    first = workload.mixed_workload(30, 7, encode, decode)
    # What the run sends vLLM and then TritonBox: built again from the seed, not copied.
    again = workload.mixed_workload(30, 7, encode, decode)
    assert first == again
    other = workload.mixed_workload(30, 8, encode, decode)
    assert [r.prompt for r in other] != [r.prompt for r in first]
    assert len({r.prompt for r in first}) == 30  # every request its own prompt


def test_lengths_in_range_and_exact_under_the_tokenizer(
    workload: ModuleType, tokenizer: Any
) -> None:
    encode, decode = tokenizer
    requests = workload.mixed_workload(60, 3, encode, decode)
    low, high = workload.PROMPT_TOKENS
    for request in requests:
        assert low <= request.prompt_tokens <= high
        assert len(encode(request.prompt)) == request.prompt_tokens  # what the servers report
        assert workload.OUTPUT_TOKENS[0] <= request.output_tokens <= workload.OUTPUT_TOKENS[1]
    # Spread over the ranges, not bunched at one end.
    prompts = [r.prompt_tokens for r in requests]
    outputs = [r.output_tokens for r in requests]
    assert max(prompts) - min(prompts) > (high - low) / 2
    assert max(outputs) - min(outputs) > (workload.OUTPUT_TOKENS[1] - workload.OUTPUT_TOKENS[0]) / 2
    assert workload.mean_output(requests) == statistics.mean(outputs)


def test_a_share_opens_with_the_common_system_prompt(workload: ModuleType, tokenizer: Any) -> None:
    encode, decode = tokenizer
    requests = workload.mixed_workload(100, 5, encode, decode)
    system = workload.system_prompt(encode, decode)
    system_tokens = len(encode(system))
    assert workload.SYSTEM_TOKENS - 3 <= system_tokens - 1 <= workload.SYSTEM_TOKENS + 1
    shared = [r for r in requests if r.shared]
    assert 15 <= len(shared) <= 45  # about SHARED_SHARE of 100
    assert all(r.prompt.startswith(system) for r in shared)
    assert not any(r.prompt.startswith(system[:40]) for r in requests if not r.shared)
    # The same token ids, so that a prefix cache can reuse them: all but the blank line's.
    ids = [encode(r.prompt) for r in shared]
    common = next(i for i, column in enumerate(zip(*ids, strict=False)) if len(set(column)) > 1)
    assert common >= system_tokens - 1


def test_arrivals_are_a_unit_rate_poisson_process(workload: ModuleType, tokenizer: Any) -> None:
    encode, decode = tokenizer
    requests = workload.mixed_workload(400, 11, encode, decode)
    arrivals = [r.arrival for r in requests]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert 0.85 < statistics.mean(gaps) < 1.15  # exponential with mean 1 s: stdev ~0.05
    assert 0.85 < statistics.stdev(gaps) < 1.15  # an exponential's stdev is its mean
