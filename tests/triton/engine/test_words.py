"""Stop words matched on token ids (TensorRT-LLM's rule); bad words on ids and on text."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from tritonbox_common.word_lists import decode_word_list, encode_word_list
from tritonbox_triton.engine.words import WordRules, text_decoder


def rules(
    tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...] = (), bad: tuple[str, ...] = ()
) -> WordRules:
    def ids(words: tuple[str, ...]) -> list[list[int]]:
        return decode_word_list(encode_word_list(tokenizer, words)) if words else []

    return WordRules(text_decoder(tokenizer), ids(stop), ids(bad))


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_bad_word_token_sequences_are_banned_after_their_prefix(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    word = rules(tokenizer, bad=(" Paris",))
    (single,) = [
        w for w in decode_word_list(encode_word_list(tokenizer, [" Paris"])) if len(w) == 1
    ][:1]
    assert single[0] in word.banned_tokens(encode(tokenizer, "The capital is"))


def test_bad_word_spelled_with_other_tokens_is_caught(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    word = rules(tokenizer, bad=("Paris",))
    context = encode(tokenizer, "It is Par")
    (is_token,) = encode(tokenizer, "is")
    assert word.completes_bad_word(context, is_token)


def test_bad_word_inside_a_longer_word_is_allowed(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    word = rules(tokenizer, bad=("is",))
    context = encode(tokenizer, "Look at th")
    (is_token,) = encode(tokenizer, "is")
    assert not word.completes_bad_word(context, is_token)  # "this" is not the word "is"
    (space_is,) = encode(tokenizer, " is")
    assert word.completes_bad_word(encode(tokenizer, "It"), space_is)


def test_a_stop_word_ends_the_sequence_on_its_last_token(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    word = rules(tokenizer, stop=("Paris",))
    assert word.hits_stop_word(encode(tokenizer, "The capital is Paris"))  # the " Paris" variant
    # Only at the end: the engine checks after every token, so it had stopped at "Paris".
    assert not word.hits_stop_word(encode(tokenizer, "The capital is Paris."))
    assert not word.hits_stop_word(encode(tokenizer, "The capital is Lyon"))


def test_a_whitespace_stop_word_is_its_own_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    word = rules(tokenizer, stop=("\n\n",))
    own = encode(tokenizer, "\n\n")
    assert word.hits_stop_word(encode(tokenizer, "One.") + own)
    assert not word.hits_stop_word(encode(tokenizer, "One.\nTwo"))


def test_stop_word_is_its_tokens_only_whitespace_included(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    # TensorRT-LLM's rule: the engine ends a sequence only on a stop word's own token ids. The
    # exact text (whitespace included) is the api's to decide; a looser engine match ended
    # " Paris.\n\n" on "\nParis" and on "Paris\n".
    generated = encode(tokenizer, " Paris.\n\nThe answer is")
    for word in ("\nParis", "Paris\n"):
        assert not rules(tokenizer, stop=(word,)).hits_stop_word(generated), word
    assert rules(tokenizer, stop=(".\n\n",)).hits_stop_word(encode(tokenizer, " Paris.\n\n"))
