"""Gemma's chat rules for the tokenizer steps: a rendered chat prompt starts with one BOS, not
two, and an answer stops on every end id the checkpoint declares (Gemma-it: <eos> and its turn
end, <end_of_turn>), on both engines (the ids reach them as end_id and one-token stop words).

The test tokenizer is built locally from the default model's files (no hub access) to behave
like Gemma's: it adds a <bos> to every encoding, its eos is <eos>, its chat template is
Gemma-it's (starting with {{ bos_token }}, turns closed by <end_of_turn>) and its
generation_config.json declares eos_token_id [<eos>, <end_of_turn>] as Gemma-2/3-it's do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tritonbox_common.end_ids import TokenIds, declared_end_ids, default_token_ids
from tritonbox_common.tokenization import (
    PreprocessingLimits,
    encode_prompt,
    load_tokenizer,
    preprocess,
)
from tritonbox_common.word_lists import decode_word_list

# google/gemma-7b-it's chat template (tokenizer_config.json), verbatim.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
    "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
MESSAGES = [{"role": "user", "content": "Name three colours."}]
LIMITS = PreprocessingLimits(max_input_len=128, max_output_len=32)


@pytest.fixture(scope="module")
def gemma_dir(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import AddedToken, Tokenizer, processors

    folder = tmp_path_factory.mktemp("gemma-like-tokenizer")
    backend = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    specials = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
    backend.add_special_tokens([AddedToken(token, special=True) for token in specials])
    bos = backend.token_to_id("<bos>")
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", bos)]
    )
    backend.save(str(folder / "tokenizer.json"))
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    config |= {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<|endoftext|>"}
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(GEMMA_TEMPLATE)
    ends = [backend.token_to_id("<eos>"), backend.token_to_id("<end_of_turn>")]
    generation = {"bos_token_id": bos, "eos_token_id": ends, "pad_token_id": 0}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


@pytest.fixture(scope="module")
def gemma(gemma_dir: Path) -> Any:
    return load_tokenizer(gemma_dir)


def ids_of(tokenizer: Any, *tokens: str) -> list[int]:
    return [int(tokenizer.convert_tokens_to_ids(token)) for token in tokens]


def test_the_test_tokenizer_behaves_like_gemmas(gemma: Any) -> None:
    bos, eos = ids_of(gemma, "<bos>", "<eos>")
    assert (gemma.bos_token_id, gemma.eos_token_id) == (bos, eos)
    assert gemma.encode("Hello")[0] == bos  # the tokenizer adds a BOS
    rendered = gemma.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<bos><start_of_turn>user\n")
    assert gemma.encode(rendered)[:2] == [bos, bos]  # the trap: two BOS


def test_a_rendered_chat_prompt_starts_with_one_bos(gemma: Any) -> None:
    rendered = gemma.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = encode_prompt(gemma, rendered, LIMITS.max_input_len)
    (bos,) = ids_of(gemma, "<bos>")
    assert ids[0] == bos and ids.count(bos) == 1
    # Exactly what transformers feeds the model for this conversation.
    expected = gemma.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    expected = expected if isinstance(expected, list) else expected["input_ids"]  # v5: a dict
    assert ids == list(expected)


def test_a_plain_prompt_keeps_its_bos(gemma: Any) -> None:
    ids = encode_prompt(gemma, "Hello there", LIMITS.max_input_len)
    assert ids == gemma.encode("Hello there") and ids[0] == gemma.bos_token_id


def test_every_declared_end_id_ends_an_answer(gemma: Any, gemma_dir: Path) -> None:
    eos, end_of_turn = ids_of(gemma, "<eos>", "<end_of_turn>")
    defaults = default_token_ids(gemma, gemma_dir)
    # The turn end is the engine's end_id (never in the output); <eos> becomes a stop word.
    assert defaults == TokenIds(end_id=end_of_turn, pad_id=0, extra_end_ids=(eos,))
    # Without generation_config.json the chat template still names the turn end.
    assert default_token_ids(gemma) == TokenIds(end_of_turn, 0, (eos,))


def test_preprocessing_sends_every_end_id_to_the_engine(gemma: Any, gemma_dir: Path) -> None:
    defaults = default_token_ids(gemma, gemma_dir)
    query = np.array([[b"Hello"], [b"Hi"]], dtype=object)
    inputs: dict[str, Any] = {
        "QUERY": query,
        "REQUEST_OUTPUT_LEN": np.array([[8], [8]], dtype=np.int32),
        "STOP_WORDS_DICT": np.array([[b"Paris"], [b""]], dtype=object),
    }
    out = preprocess(gemma, LIMITS, defaults, inputs)
    assert out["OUT_END_ID"].tolist() == [[defaults.end_id]] * 2
    paris = decode_word_list(out["STOP_WORDS_IDS"][0])
    assert [defaults.extra_end_ids[0]] in paris and len(paris) >= 2  # the user's word stays
    assert decode_word_list(out["STOP_WORDS_IDS"][1]) == [[defaults.extra_end_ids[0]]]
    # A client that names its END_ID gets that one end only.
    named = preprocess(gemma, LIMITS, defaults, inputs | {"END_ID": np.array([[5], [5]])})
    assert named["OUT_END_ID"].tolist() == [[5], [5]]
    assert decode_word_list(named["STOP_WORDS_IDS"][1]) == []


def test_the_default_model_is_unchanged(tokenizer: Any, tokenizer_dir: Path) -> None:
    # SmolLM2: its template's <|im_end|> is its eos and generation_config's only end id.
    assert default_token_ids(tokenizer, tokenizer_dir) == TokenIds(end_id=2, pad_id=2)
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert encode_prompt(tokenizer, rendered, 512) == tokenizer.encode(rendered)


@pytest.mark.parametrize(
    ("content", "ids"),
    [
        ({"eos_token_id": 1}, [1]),
        ({"eos_token_id": [1, 107]}, [1, 107]),
        ({"eos_token_id": None}, []),
        ({"eos_token_id": [True, -1, "x", 3]}, [3]),
        ({}, []),
        ([], []),
    ],
)
def test_declared_end_ids(tmp_path: Path, content: Any, ids: list[int]) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps(content))
    assert declared_end_ids(tmp_path) == ids


def test_declared_end_ids_without_a_readable_file(tmp_path: Path) -> None:
    assert declared_end_ids(tmp_path) == []
    (tmp_path / "generation_config.json").write_text("{not json")
    assert declared_end_ids(tmp_path) == []
