"""CHAT_TEMPLATE: the templates shipped for each family render a conversation as the family's
own template does, and the setting replaces a checkpoint's template in a copy of its tokenizer
(never the weights, never the source folder)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tritonbox_common.tokenization import load_tokenizer
from tritonbox_triton.chat_template import read_chat_template, with_chat_template


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        (
            "gemma",
            "<B><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello"
            "<end_of_turn>\n<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n",
        ),
        (
            "llama",
            "<B><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhy?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        (
            "qwen2",
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n"
            "<|im_start|>assistant\n",
        ),
        (
            "qwen3",
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n"
            "<|im_start|>assistant\n",
        ),
        ("mistral", "<B>[INST] Be brief.\n\nHi [/INST]Hello<E>[INST] Why? [/INST]"),
    ],
)
def test_shipped_templates(family: str, expected: str, tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>x</think>\nHello"},
        {"role": "user", "content": "Why?"},
    ]
    if family != "qwen3":  # only Qwen3's template drops an earlier answer's thinking
        messages[2]["content"] = "Hello"
    text = tokenizer.apply_chat_template(
        messages,
        chat_template=read_chat_template(family),
        tokenize=False,
        add_generation_prompt=True,
        bos_token="<B>",  # the default tokenizer's are ChatML's own <|im_start|>, <|im_end|>
        eos_token="<E>",
    )
    assert text == expected


def test_qwen2_default_system_and_qwen3_without_thinking(tokenizer: Any) -> None:
    user = [{"role": "user", "content": "Hi"}]
    qwen2 = tokenizer.apply_chat_template(
        user, chat_template=read_chat_template("qwen2"), tokenize=False
    )
    assert qwen2.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    qwen3 = tokenizer.apply_chat_template(
        user,
        chat_template=read_chat_template("QWEN3"),
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    assert qwen3.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_chat_template_overrides_a_checkpoint_folder(tokenizer_dir: Path, tmp_path: Path) -> None:
    # An ordinary checkpoint with its own template: CHAT_TEMPLATE replaces it in a copy of the
    # tokenizer files (never the weights), and the source folder is left as it was.
    before = {p.name: p.stat().st_mtime_ns for p in tokenizer_dir.iterdir()}
    template = read_chat_template("gemma")
    folder = with_chat_template(tokenizer_dir, template, tmp_path)
    assert folder.name == tokenizer_dir.name  # MODEL_NAME defaults to this name
    assert not list(folder.glob("*.safetensors")) and (folder / "config.json").is_file()
    assert "chat_template" not in json.loads((folder / "tokenizer_config.json").read_text())
    assert load_tokenizer(folder).chat_template == template
    assert {p.name: p.stat().st_mtime_ns for p in tokenizer_dir.iterdir()} == before
    assert with_chat_template(tokenizer_dir, template, tmp_path) == folder  # made once
    assert with_chat_template(tokenizer_dir, template + "\n", tmp_path) != folder
    with pytest.raises(ValueError, match=r"neither a file nor a shipped template .*gemma"):
        read_chat_template("vicuna")
