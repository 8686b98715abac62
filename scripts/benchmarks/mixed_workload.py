"""The open-loop benchmark's requests: seeded, each with its own prompt and exact output length,
a share of them opening with one common system prompt, and Poisson arrival times.

Pure and deterministic: the same seed and tokenizer give the same requests, so that every server
of a run (vLLM in each configuration, TritonBox) is sent the very same ones. Prompt lengths are
exact token counts under the model's tokenizer, checked against each server's usage.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Encode = Callable[[str], list[int]]
Decode = Callable[[list[int]], str]

PROMPT_TOKENS = (20, 500)  # each request's prompt, inclusive
OUTPUT_TOKENS = (32, 256)  # each request's exact output, inclusive
SHARED_SHARE = 0.3  # of the requests open with SYSTEM_TOKENS of one common system prompt
SYSTEM_TOKENS = 300
# Words drawn for the prompts: several topics' vocabulary, so that two prompts share no more
# than what common English shares (a prefix cache gains only on the system prompt).
VOCABULARY = (
    "river mountain forest village harbour bridge tower garden market castle desert island "
    "engine signal circuit voltage sensor battery cable network server protocol packet router "
    "recipe flour butter garlic onion pepper oven simmer roast kettle spoon bakery harvest "
    "theorem matrix vector integral proof lemma prime number graph function limit series "
    "contract invoice budget ledger payment customer supplier quarter revenue margin audit "
    "planet comet orbit telescope galaxy nebula gravity rocket launch crater eclipse moon "
    "violin melody chorus rhythm guitar concert lyric tempo drum opera ballad piano "
    "doctor patient clinic fever vaccine nurse therapy symptom dose pulse recovery "
    "the a of and to in on with for from by about under over after before because while "
    "quickly slowly carefully often never always sometimes perhaps nearly almost quite "
    "build explain compare describe measure repair travel write read carry follow design "
    "green heavy bright narrow ancient modern quiet sudden gentle complex simple careful"
)
WORDS = tuple(VOCABULARY.split())
ASKS = (
    "Explain this", "Summarise the notes", "Answer the question", "Continue the story",
    "List the main points", "Rewrite it plainly", "Translate the idea", "Give three examples",
)  # fmt: skip


@dataclass(frozen=True)
class MixedRequest:
    prompt: str
    prompt_tokens: int  # under the model's tokenizer, as the servers count it
    output_tokens: int  # exactly this many are asked for and must come back
    shared: bool  # opens with the common system prompt
    arrival: float  # seconds from the first request at 1 request/s; divide by the rate


def _sentences(rng: random.Random, words: int) -> str:
    """About `words` words of varied sentences (5-15 words each)."""
    out: list[str] = []
    while len(out) < words:
        sentence = [rng.choice(WORDS) for _ in range(rng.randint(5, 15))]
        if rng.random() < 0.2:
            sentence.insert(rng.randrange(len(sentence)), str(rng.randint(2, 9999)))
        out += [sentence[0].capitalize(), *sentence[1:-1], sentence[-1] + rng.choice(".?!;,")]
    return " ".join(out)


def _cut(text: str, tokens: int, encode: Encode, decode: Decode) -> tuple[str, int]:
    """`text` cut to `tokens` tokens, or one to three fewer where the cut's decoded text
    encodes differently; the text and its token count."""
    ids = encode(text)
    if len(ids) < tokens:
        raise ValueError(f"{len(ids)} tokens of text, {tokens} wanted")
    for size in range(tokens, tokens - 4, -1):
        cut = decode(ids[:size])
        if len(encode(cut)) == size:
            return cut, size
    raise ValueError(f"no cut near {tokens} tokens encodes to its own length")


def system_prompt(encode: Encode, decode: Decode) -> str:
    """The common system prompt: SYSTEM_TOKENS tokens (or up to three fewer), the same for
    every run, then a blank line before each request's own text."""
    rng = random.Random("system prompt")
    head = "You are a careful assistant for a small engineering firm. Follow these notes. "
    text, _ = _cut(head + _sentences(rng, SYSTEM_TOKENS), SYSTEM_TOKENS, encode, decode)
    return text + "\n\n"


def mixed_workload(count: int, seed: int, encode: Encode, decode: Decode) -> list[MixedRequest]:
    """`count` requests: prompt lengths uniform over PROMPT_TOKENS (at least the system prompt
    and 20 tokens more for the shared ones), output lengths uniform over OUTPUT_TOKENS, about
    SHARED_SHARE of them shared, gaps exponential with mean 1 s (a Poisson process at
    1 request/s, the first at 0)."""
    rng = random.Random(seed)
    system = system_prompt(encode, decode)
    system_tokens = len(encode(system))
    requests, at = [], 0.0
    for index in range(count):
        shared = rng.random() < SHARED_SHARE
        low = system_tokens + PROMPT_TOKENS[0] if shared else PROMPT_TOKENS[0]
        wanted = rng.randint(low, PROMPT_TOKENS[1])
        ask = f"{rng.choice(ASKS)} ({index}): "  # the index: no two prompts start alike
        text = (system if shared else "") + ask + _sentences(rng, wanted)
        prompt, tokens = _cut(text, wanted, encode, decode)
        if index:
            at += rng.expovariate(1.0)
        requests.append(
            MixedRequest(prompt, tokens, rng.randint(*OUTPUT_TOKENS), shared, round(at, 6))
        )
    return requests


def mean_output(requests: Sequence[MixedRequest]) -> float:
    """Output tokens per request on average: converts a capacity in tok/s to requests/s."""
    return sum(r.output_tokens for r in requests) / len(requests)
