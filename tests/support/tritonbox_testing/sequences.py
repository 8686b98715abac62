"""A sequence's sampling state for the engine's unit tests of token choice."""

from __future__ import annotations

from tritonbox_triton.engine.params import SamplingParams
from tritonbox_triton.engine.sampling import SequenceState
from tritonbox_triton.engine.words import WordRules


def sequence_state(**params: float | int) -> SequenceState:
    """A sequence of prompt [3, 4, 4] with these sampling `params` (end and pad id 0, at most
    8 tokens unless given), decoding ids as letters for its word rules."""
    settings = {"max_tokens": 8, "end_id": 0, "pad_id": 0, **params}
    return SequenceState(
        params=SamplingParams(**settings),  # type: ignore[arg-type]
        prompt=[3, 4, 4],
        words=WordRules(lambda ids: "".join(chr(97 + i % 26) for i in ids)),
    )
