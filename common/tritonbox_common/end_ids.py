"""Which tokens end a model's answer: more than the tokenizer's eos for chat models.

Gemma-it ends its turn with <end_of_turn> while its eos is <eos>; generation_config.json may
list several `eos_token_id`s. Read locally from the checkpoint's files; never from a hub.
`default_token_ids` gathers them into the end and pad ids a request gets when it names none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Tokens that end a turn in well-known chat templates (Gemma, Llama 3, ChatML, Phi-3). One is an
# end id of a model when its chat template writes it and the tokenizer has it as one token.
TURN_END_TOKENS = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>")


@dataclass(frozen=True, slots=True)
class TokenIds:
    end_id: int
    pad_id: int
    # Further tokens that end an answer (Gemma-it ends its turn with <end_of_turn>, its eos is
    # <eos>). The engines take one end_id, so these go to them as one-token stop words.
    extra_end_ids: tuple[int, ...] = ()


def declared_end_ids(checkpoint_dir: Path) -> list[int]:
    """`eos_token_id` of the checkpoint's generation_config.json: one id or a list of them."""
    try:
        value = json.loads((checkpoint_dir / "generation_config.json").read_text())
    except (OSError, ValueError):
        return []
    ids = value.get("eos_token_id") if isinstance(value, dict) else None
    values = ids if isinstance(ids, list) else [ids]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]


def turn_end_ids(tokenizer: Any) -> list[int]:
    """The TURN_END_TOKENS the tokenizer's chat template writes, as token ids."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return []
    ids = []
    for token in TURN_END_TOKENS:
        encoded = tokenizer.encode(token, add_special_tokens=False) if token in template else []
        if len(encoded) == 1:
            ids.append(int(encoded[0]))
    return ids


def unique(ids: Iterable[int]) -> list[int]:
    return list(dict.fromkeys(ids))


def default_token_ids(tokenizer: Any, checkpoint_dir: Path | None = None) -> TokenIds:
    """Every id that ends an answer: the chat template's turn end first (so that it, not a
    stop word, ends a chat answer and never shows in the output), then what generation_config.json
    declares, then the tokenizer's eos. pad_id: the pad token, else end_id."""
    ids = unique(
        [
            *turn_end_ids(tokenizer),
            *(declared_end_ids(checkpoint_dir) if checkpoint_dir else []),
            *([int(tokenizer.eos_token_id)] if tokenizer.eos_token_id is not None else []),
        ]
    )
    if not ids:
        raise ValueError(
            "the tokenizer has no eos token and generation_config.json declares no "
            "eos_token_id, so END_ID has no default"
        )
    end_id = ids[0]
    pad_id = end_id if tokenizer.pad_token_id is None else int(tokenizer.pad_token_id)
    return TokenIds(end_id=end_id, pad_id=pad_id, extra_end_ids=tuple(ids[1:]))
