"""IncrementalDecoder: however the ids are chunked, the text equals decoding them all at once."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from tritonbox_api.text.decoder import MAX_WINDOW_IDS, IncrementalDecoder

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces,  double  spaces and a trailing one ",
    "line one\nline two\n\n\ttabbed\r\nend",
    "中文 和 日本語のテキスト、句読点。",
    "café naïve résumé Ångström über",
    "wave 👋🏽 family 👨‍👩‍👧 flag 🏳️‍🌈 done",
    "👨‍👩‍👧👋🏽中",
    "Mixed: été 中文 👋\n\nThe end.",
]
CHUNK_SIZES = [1, 2, 3, 1000]


def expected(tokenizer: Any, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return str(
        tokenizer.decode(
            list(ids),
            skip_special_tokens=skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def fixed_chunks(ids: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def random_chunks(ids: Sequence[int], rng: random.Random) -> Iterator[Sequence[int]]:
    start = 0
    while start < len(ids):
        size = rng.choice([0, 1, 1, 2, 3, 5, 8])  # 0: empty pushes happen too
        yield ids[start : start + size]
        start += size


def stream(decoder: IncrementalDecoder, chunks: Iterator[Sequence[int]]) -> list[str]:
    return [decoder.push(chunk) for chunk in chunks] + [decoder.flush()]


def with_specials(
    tokenizer: Any, ids: list[int], rng: random.Random, *, inside_characters: bool = True
) -> list[int]:
    """`ids` with special tokens (eos, bos, ...) at random places.

    Kept in the text, a special token inside a character breaks it for good, and SentencePiece's
    byte fallback then turns the whole run of bytes around it into U+FFFD, text emitted long
    before included: no streaming decoder can match that, so such places can be avoided.
    """
    places = [
        place
        for place in range(len(ids) + 1)
        if inside_characters or not expected(tokenizer, ids[:place]).endswith("\ufffd")
    ]
    specials = list(tokenizer.all_special_ids)
    mixed = list(ids)
    for place in sorted(rng.sample(places, rng.randint(1, 4)), reverse=True):
        mixed.insert(place, rng.choice(specials))
    return mixed


@pytest.mark.parametrize("size", CHUNK_SIZES)
@pytest.mark.parametrize("text", TEXTS)
def test_fixed_chunks_give_the_full_decode(tokenizer: Any, text: str, size: int) -> None:
    ids = encode(tokenizer, text)
    decoder = IncrementalDecoder(tokenizer)
    pieces = stream(decoder, fixed_chunks(ids, size))
    assert "".join(pieces) == decoder.text == expected(tokenizer, ids)
    assert decoder.ids == tuple(ids)
    # Valid UTF-8 never shows a replacement character, not even for a moment.
    assert not any("\ufffd" in piece for piece in pieces)


def test_random_chunks_with_special_tokens(tokenizer: Any) -> None:
    rng = random.Random(1234)
    for _ in range(300):
        text = rng.choice(TEXTS)
        ids = with_specials(tokenizer, encode(tokenizer, text), rng)
        decoder = IncrementalDecoder(tokenizer)
        pieces = stream(decoder, random_chunks(ids, rng))
        assert "".join(pieces) == expected(tokenizer, ids)
        assert not any("\ufffd" in piece for piece in pieces)


def test_special_tokens_kept_when_asked(tokenizer: Any) -> None:
    rng = random.Random(5)
    for text in TEXTS:
        ids = with_specials(tokenizer, encode(tokenizer, text), rng, inside_characters=False)
        decoder = IncrementalDecoder(tokenizer, skip_special_tokens=False)
        text_out = "".join(stream(decoder, random_chunks(ids, rng)))
        assert text_out == expected(tokenizer, ids, skip_special_tokens=False)
        assert tokenizer.eos_token in text_out or tokenizer.eos_token_id not in ids


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_ids_byte_level(byte_level_tokenizer: Any, skip_special_tokens: bool) -> None:
    # Any ids at all, invalid UTF-8 included: byte-level decoding replaces bad bytes locally.
    tokenizer = byte_level_tokenizer
    rng = random.Random(99)
    byte_tokens = encode(tokenizer, "👨‍👩‍👧中é")  # many lone bytes, to make broken sequences
    specials = list(tokenizer.all_special_ids)
    for _ in range(300):
        pool = [rng.randrange(len(tokenizer)), rng.choice(byte_tokens), rng.choice(specials)]
        ids = [rng.choice(pool) for _ in range(rng.randint(0, 30))]
        decoder = IncrementalDecoder(tokenizer, skip_special_tokens=skip_special_tokens)
        text = "".join(stream(decoder, random_chunks(ids, rng)))
        assert text == expected(tokenizer, ids, skip_special_tokens)


def test_split_emoji_is_held_back_until_complete(tokenizer: Any) -> None:
    head = encode(tokenizer, "Hi")
    ids = encode(tokenizer, "Hi 👋🏽")
    assert ids[: len(head)] == head
    assert len(ids) > len(head) + 3  # the emoji really is split across byte tokens
    decoder = IncrementalDecoder(tokenizer)
    assert "".join(decoder.push([token]) for token in head) == "Hi"
    outputs = [decoder.push([token]) for token in ids[len(head) :]]
    # Each emoji shows up whole, with the push of its last byte, and never before.
    assert [piece for piece in outputs if piece] == [" ", "👋", "🏽"]
    assert outputs[-1] == "🏽"
    assert decoder.flush() == ""


def test_text_before_an_incomplete_character_is_released(byte_level_tokenizer: Any) -> None:
    ids = encode(byte_level_tokenizer, "Hi 👋")
    decoder = IncrementalDecoder(byte_level_tokenizer)
    assert decoder.push(ids[:-1]) == "Hi "
    assert decoder.push([]) == ""
    assert decoder.push(ids[-1:]) == "👋"
    assert decoder.flush() == ""
    assert decoder.text == "Hi 👋"


def test_flush_releases_an_unfinished_character_as_decoded(tokenizer: Any) -> None:
    ids = encode(tokenizer, "ok 👨‍👩‍👧")[:-1]
    decoder = IncrementalDecoder(tokenizer)
    released = decoder.push(ids)
    assert "\ufffd" not in released
    tail = decoder.flush()
    assert tail.endswith("\ufffd")
    assert released + tail == expected(tokenizer, ids)
    assert decoder.flush() == ""


def test_empty_stream(tokenizer: Any) -> None:
    decoder = IncrementalDecoder(tokenizer)
    assert decoder.push([]) == ""
    assert decoder.flush() == ""
    assert decoder.text == ""
    assert decoder.ids == ()


class CountingTokenizer:
    """Records the longest id list each decode() call received."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.longest = 0

    def decode(
        self,
        token_ids: list[int],
        /,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> str:
        self.longest = max(self.longest, len(token_ids))
        return str(
            self.tokenizer.decode(
                token_ids,
                skip_special_tokens=skip_special_tokens,
                clean_up_tokenization_spaces=clean_up_tokenization_spaces,
            )
        )


def test_each_step_decodes_a_short_window(tokenizer: Any) -> None:
    text = " ".join(TEXTS) * 10
    ids = encode(tokenizer, text)
    counting = CountingTokenizer(tokenizer)
    decoder = IncrementalDecoder(counting)
    assert "".join(stream(decoder, fixed_chunks(ids, 1))) == text
    assert len(ids) > 500
    # The longest run of byte tokens making one character (byte fallback: 👨‍👩‍👧 is 18).
    assert counting.longest <= 20


def test_the_rust_decode_is_used_only_where_it_equals_the_public_one(tokenizer: Any) -> None:
    # The tests above compare with tokenizer.decode, so they check the direct path's text.
    assert IncrementalDecoder(tokenizer)._direct is not None

    class Custom(type(tokenizer)):  # type: ignore[misc]
        def decode(self, *args: Any, **kwargs: Any) -> str:
            return "custom"

    custom = copy.copy(tokenizer)
    custom.__class__ = Custom
    decoder = IncrementalDecoder(custom)
    assert decoder._direct is None
    assert decoder._decode(encode(tokenizer, "Hello")) == "custom"


def stray_byte(tokenizer: Any) -> int:
    """An id that decodes to a lone UTF-8 continuation byte (never valid on its own)."""
    sentencepiece = tokenizer.convert_tokens_to_ids("<0x80>")
    if isinstance(sentencepiece, int) and sentencepiece != tokenizer.unk_token_id:
        return sentencepiece
    (byte_level,) = tokenizer.convert_tokens_to_ids(["Ģ"])  # GPT-2's character for byte 0x80
    return int(byte_level)


def test_stray_bytes_keep_the_window_short(tokenizer: Any) -> None:
    # 2 000 invalid bytes used to grow the window to all of them: 2M ids decoded in total.
    stray = stray_byte(tokenizer)
    assert expected(tokenizer, [stray]) == "\ufffd"
    ids = encode(tokenizer, "Hi") + [stray] * 2000 + encode(tokenizer, " there 👋🏽")
    counting = CountingTokenizer(tokenizer)
    decoder = IncrementalDecoder(counting)
    text = "".join(stream(decoder, fixed_chunks(ids, 1)))
    assert text == expected(tokenizer, ids)
    assert counting.longest <= MAX_WINDOW_IDS + 1
