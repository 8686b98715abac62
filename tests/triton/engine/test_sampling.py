"""Per-row logits processing agrees with transformers' own processors."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from tritonbox_testing.sequences import sequence_state as state

from tritonbox_triton.engine.params import SamplingParams
from tritonbox_triton.engine.sampling import (
    SequenceState,
    _apply_penalties,
    choose_token,
)
from tritonbox_triton.engine.truncation import draw_index, filter_top_k_top_p, kept_ids
from tritonbox_triton.engine.words import WordRules

VOCAB = 64


def _draw_masked(logits: torch.Tensor, generator: torch.Generator) -> int:
    """A token drawn over a row whose removed tokens are -inf (as choose_token drew before
    `kept_ids`)."""
    kept = (logits > float("-inf")).nonzero().flatten()
    return int(kept[draw_index(logits[kept].numpy(), generator)])


def test_repetition_penalty_matches_transformers() -> None:
    logits = torch.randn(VOCAB)
    seq = state(repetition_penalty=1.7)
    seq.append(9)
    ours = logits.clone()
    _apply_penalties(ours, seq)
    theirs = RepetitionPenaltyLogitsProcessor(1.7)(
        torch.tensor([[3, 4, 4, 9]]), logits[None].clone()
    )
    assert torch.equal(ours, theirs[0])


def test_presence_and_frequency_penalties_follow_openai() -> None:
    logits = torch.zeros(VOCAB)
    seq = state(presence_penalty=0.5, frequency_penalty=0.25)
    for token in (7, 7, 7, 8):
        seq.append(token)
    _apply_penalties(logits, seq)
    assert logits[7] == pytest.approx(-(0.5 + 3 * 0.25))
    assert logits[8] == pytest.approx(-(0.5 + 0.25))
    assert logits[3] == 0  # prompt tokens are not penalised: OpenAI counts generated tokens only


@pytest.mark.parametrize(("top_k", "top_p"), [(5, 0.0), (0, 0.8), (10, 0.5), (0, 1.0)])
def test_top_k_top_p_match_transformers(top_k: int, top_p: float) -> None:
    logits = torch.randn(VOCAB)
    expected = logits[None].clone()
    if top_k:
        expected = TopKLogitsWarper(top_k)(torch.tensor([[0]]), expected)
    if 0 < top_p < 1:
        expected = TopPLogitsWarper(top_p)(torch.tensor([[0]]), expected)
    assert torch.equal(filter_top_k_top_p(logits.clone(), top_k, top_p), expected[0])


def test_seeded_sampling_is_reproducible_and_seed_dependent() -> None:
    logits = torch.randn(VOCAB)

    def draw(seed: int) -> list[int]:
        seq = state(temperature=1.0, top_k=0, top_p=1.0, seed=seed)
        tokens = []
        for _ in range(12):
            token = choose_token(logits.clone(), seq).token
            seq.append(token)
            tokens.append(token)
        return tokens

    assert draw(5) == draw(5)
    assert draw(5) != draw(6)


def test_min_tokens_masks_the_end_id() -> None:
    logits = torch.zeros(VOCAB)
    logits[0] = 10.0  # the end id would win
    seq = state(temperature=0.0, min_tokens=2)
    assert choose_token(logits.clone(), seq).token != 0
    seq.append(5)
    seq.append(6)
    assert choose_token(logits.clone(), seq).token == 0


def test_logprob_is_of_the_chosen_token() -> None:
    logits = torch.tensor([0.0, 1.0, 2.0, 3.0])
    choice = choose_token(logits.clone(), state(temperature=0.0))
    assert choice.token == 3
    assert choice.logprob == pytest.approx(float(torch.log_softmax(logits, -1)[3]))


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("scale", [2.0, 6.0, 12.0])
def test_top_p_over_a_model_sized_vocabulary_matches_transformers(
    top_p: float, scale: float
) -> None:
    # A model's logits are peaked: top-p then decides among a few candidates instead of sorting
    # all 49,152 (scale 2 is flat enough to take the full sort).
    logits = torch.randn(49152, generator=torch.Generator().manual_seed(int(scale))) * scale
    expected = TopPLogitsWarper(top_p)(torch.tensor([[0]]), logits[None].clone())
    assert torch.equal(filter_top_k_top_p(logits.clone(), 0, top_p), expected[0])


def test_a_draw_follows_the_distribution_and_never_takes_a_removed_token() -> None:
    logits = torch.full((1000,), float("-inf"))  # what top-k and top-p removed is -inf
    logits[[3, 500, 999]] = torch.tensor([0.2, 0.5, 0.3]).log() + 7.0  # any scale
    generator = torch.Generator().manual_seed(0)
    draws = Counter(_draw_masked(logits, generator) for _ in range(4000))
    assert set(draws) == {3, 500, 999}
    for token, share in ((3, 0.2), (500, 0.5), (999, 0.3)):
        assert abs(draws[token] / 4000 - share) < 0.03


def _drawn_as_before(logits: torch.Tensor, seq: SequenceState) -> int:
    """A sampled row's token the way choose_token drew it before `kept_ids`: a mask over the
    vocabulary, -inf for each rejected token, then the best that is left."""
    context = seq.context()
    for token in seq.words.banned_tokens(context):
        logits[token] = float("-inf")
    filtered = filter_top_k_top_p(logits, seq.params.top_k, seq.params.top_p)
    for _ in range(32):
        token = _draw_masked(filtered, seq.generator)
        if not seq.words.completes_bad_word(context, token):
            return token
        filtered[token] = float("-inf")
        if torch.isneginf(filtered).all():
            return token
    return int(torch.argmax(filtered))


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.9), (0, 0.95), (0, 1.0), (20, 0.9), (0, 0.5)])
@pytest.mark.parametrize("scale", [2.0, 8.0])
def test_sampling_among_the_kept_ids_draws_what_the_masks_drew(
    top_k: int, top_p: float, scale: float
) -> None:
    """`kept_ids` is the masks' finite set, and the same seed draws the same tokens, bad-word
    rejections included."""
    generator = torch.Generator().manual_seed(int(scale * 100) + top_k)
    for _ in range(20):
        logits = torch.randn(4096, generator=generator) * scale
        logits[torch.randint(0, 4096, (50,), generator=generator)] = float("-inf")  # bans
        filtered = filter_top_k_top_p(logits.clone(), top_k, top_p)
        expected_ids = (filtered > float("-inf")).nonzero().flatten().numpy()
        logprobs = torch.log_softmax(logits, dim=-1)
        assert np.array_equal(kept_ids(logits.clone(), logprobs, top_k, top_p), expected_ids)

    def decode(ids: list[int]) -> str:
        return "".join(f" w{i % 7}" for i in ids)

    best = [int(i) for i in torch.topk(torch.randn(4096, generator=generator), 3).indices]
    # A peaked row's likeliest tokens are bad words: each is banned, and every other token that
    # decodes to the same word is rejected by the text check, then drawn again.
    bad = [[token] for token in best]
    for seed in range(10):
        logits = torch.randn(4096, generator=generator) * scale
        logits[best] += 6.0
        rows = []
        for _ in range(2):
            seq = SequenceState(
                params=SamplingParams(max_tokens=8, end_id=0, pad_id=0, temperature=1.0,
                                      top_k=top_k, top_p=top_p, seed=seed),
                prompt=[3, 4, 4],
                words=WordRules(decode, bad_words=bad),
            )  # fmt: skip
            rows.append(seq)
        new = [choose_token(logits.clone(), rows[0]).token for _ in range(3)]
        old = [_drawn_as_before(logits.clone(), rows[1]) for _ in range(3)]
        assert new == old
