"""StopStringMatcher: the text is cut at the earliest stop word, however it is chunked."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from tritonbox_api.text.stop_words import StopStringMatcher


def cut(text: str, stop_words: Sequence[str]) -> str:
    """The reference: `text` up to the earliest occurrence of any stop word."""
    starts = [start for word in stop_words if (start := text.find(word)) >= 0]
    return text[: min(starts, default=len(text))]


def run(stop_words: Sequence[str], chunks: Sequence[str]) -> tuple[list[str], StopStringMatcher]:
    matcher = StopStringMatcher(stop_words)
    return [matcher.push(chunk) for chunk in chunks] + [matcher.flush()], matcher


def test_no_stop_words_passes_everything_through() -> None:
    outputs, matcher = run([], ["a", "", "b\n\n", "c"])
    assert outputs == ["a", "", "b\n\n", "c", ""]
    assert not matcher.stopped
    assert matcher.matched is None


def test_match_cuts_and_stops_for_good() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.push("abc STOP def") == "abc "
    assert matcher.stopped
    assert matcher.matched == "STOP"
    assert matcher.push("more text") == ""
    assert matcher.flush() == ""


def test_stop_word_spanning_many_pushes() -> None:
    outputs, matcher = run(["<|end|>"], ["Hello <", "|", "en", "d|", "> after"])
    assert outputs == ["Hello ", "", "", "", "", ""]
    assert matcher.matched == "<|end|>"


def test_partial_match_that_fails_is_released() -> None:
    outputs, matcher = run(["###"], ["a#", "#", "b", "#"])
    assert outputs == ["a", "", "##b", "", "#"]
    assert not matcher.stopped


def test_held_back_text_released_by_flush() -> None:
    outputs, matcher = run(["STOP"], ["abc ST"])
    assert outputs == ["abc ", "ST"]
    assert not matcher.stopped


def test_stop_word_starting_a_stream() -> None:
    outputs, matcher = run(["\n\n"], ["\n", "\nrest"])
    assert outputs == ["", "", ""]
    assert matcher.matched == "\n\n"


def test_blank_line_stop_word() -> None:
    outputs, matcher = run(["\n\n"], ["para one\n", "\nmore", "text"])
    assert outputs == ["para one", "", "", ""]
    assert matcher.matched == "\n\n"


def test_unicode_stop_words() -> None:
    outputs, matcher = run(["。", "終わり"], ["これで終わ", "り。次"])
    assert outputs == ["これで", "", ""]
    assert matcher.matched == "終わり"
    outputs, matcher = run(["👋🏽"], ["hi 👋", "🏽 there"])
    assert outputs == ["hi ", "", ""]


def test_earliest_start_wins_over_list_order() -> None:
    # "bc" is complete first, but "abcd" starts earlier and is complete in the same push.
    outputs, matcher = run(["bc", "abcd"], ["xab", "cd", "e"])
    assert outputs == ["x", "", "", ""]
    assert matcher.matched == "abcd"


def test_overlapping_words() -> None:
    outputs, matcher = run(["abc", "bcd"], ["zabcd"])
    assert outputs == ["z", ""]
    assert matcher.matched == "abc"


def test_stop_word_that_is_a_prefix_of_another() -> None:
    # On a tie the longest word wins, when both are complete in the same push...
    outputs, matcher = run(["ab", "abc"], ["xabc"])
    assert (outputs, matcher.matched) == (["x", ""], "abc")
    # ...but the shorter one stops the stream as soon as it is complete: the cut is the same.
    outputs, matcher = run(["ab", "abc"], ["xab", "c"])
    assert (outputs, matcher.matched) == (["x", "", ""], "ab")


def test_longer_word_starting_earlier_is_waited_for() -> None:
    words = ["STOP HERE!", "HERE"]
    # "HERE" is complete, but "STOP HERE!" starts earlier and may still complete.
    outputs, matcher = run(words, ["go STOP HE", "RE", "!", "more"])
    assert (outputs, matcher.matched) == (["go ", "", "", "", ""], "STOP HERE!")
    outputs, matcher = run(words, ["go STOP HE", "RE", " x"])
    assert (outputs, matcher.matched) == (["go ", "", "STOP ", ""], "HERE")
    # The stream ends while waiting: flush still cuts at the match.
    outputs, matcher = run(words, ["go STOP HE", "RE"])
    assert (outputs, matcher.matched) == (["go ", "", "STOP "], "HERE")
    assert matcher.stopped


def test_repeated_letters_in_a_stop_word() -> None:
    outputs, matcher = run(["aab"], ["aa", "ab", "c"])
    assert outputs == ["", "a", "", ""]
    assert matcher.matched == "aab"


def test_only_the_longest_possible_start_is_held() -> None:
    matcher = StopStringMatcher(["Human:", "User:"])
    assert matcher.push("Hello Us") == "Hello "
    assert matcher.push("e") == ""
    assert matcher.push("d to") == "Used to"
    assert matcher.push(" Hum") == " "


def test_empty_stop_word_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        StopStringMatcher(["ok", ""])


def longest_held(text: str, stop_words: Sequence[str]) -> int:
    """The longest end of `text` that is a proper start of some stop word (naively)."""
    return max(
        (size for word in stop_words for size in range(1, len(word)) if text.endswith(word[:size])),
        default=0,
    )


def random_chunks(text: str, rng: random.Random) -> list[str]:
    chunks, start = [], 0
    while start < len(text):
        size = rng.choice([0, 1, 1, 2, 3, 5])
        chunks.append(text[start : start + size])
        start += size
    return chunks


def test_random_chunkings_match_the_reference() -> None:
    rng = random.Random(20240607)
    alphabet = "ab\n é中"  # few letters, so stop words and near misses are frequent
    for _ in range(3000):
        stop_words = [
            "".join(rng.choices(alphabet, k=rng.randint(1, 4))) for _ in range(rng.randint(0, 3))
        ]
        text = "".join(rng.choices(alphabet, k=rng.randint(0, 30)))
        matcher = StopStringMatcher(stop_words)
        released, seen = "", ""
        for chunk in random_chunks(text, rng):
            was_stopped = matcher.stopped
            out = matcher.push(chunk)
            assert not (was_stopped and out)  # nothing after a match, ever
            released += out
            seen += chunk
            if not matcher.stopped:
                # Released as early as possible: only a possible start of a stop word waits.
                assert released == seen[: len(seen) - longest_held(seen, stop_words)]
        released += matcher.flush()
        assert released == cut(text, stop_words), (text, stop_words)
        assert matcher.stopped == any(word in text for word in stop_words)
        if matcher.matched is not None:
            assert text[len(released) :].startswith(matcher.matched)
