"""The demo adapter (scripts/train_demo_adapter): its committed data, and a two-step training
on a handful of examples that must leave a PEFT folder both peft and TritonBox's reader accept."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from tritonbox_testing.repo_scripts import script_module

from tritonbox_common.lora import LLAMA_MODULES, read_peft_adapter


@pytest.fixture(scope="module")
def scripts() -> tuple[ModuleType, ModuleType]:
    import peft  # noqa: F401  (before the scripts: repo_scripts.py says why)

    data = script_module("scripts.demo_adapter.data")
    return data, script_module("scripts.demo_adapter.train")


def test_committed_data_parses_and_is_what_the_generator_writes(
    scripts: tuple[ModuleType, ModuleType],
) -> None:
    data, _ = scripts
    rows = data.load()
    assert 200 <= len(rows) <= 1000
    answers = [row["messages"][1]["content"] for row in rows]
    assert all(answer.startswith(data.OPENER) for answer in answers)
    questions = {row["messages"][0]["content"] for row in rows}
    assert len(questions) == len(rows), "every question once"
    assert not questions & set(data.UNSEEN_PROMPTS), "the check's prompts stay unseen"
    assert data.DATA_FILE.read_text(encoding="utf-8") == data.render()


def test_a_line_that_is_not_a_chat_pair_is_refused(
    scripts: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    data, _ = scripts
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        data.load(path)


def test_a_short_training_writes_a_valid_peft_adapter(
    scripts: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    from peft import PeftConfig

    _, train = scripts
    out = tmp_path / "tiny"
    # One thread: on a busy machine two spin against each other (10x slower here).
    tiny = ["--steps", "2", "--limit", "2", "--batch-size", "1", "--rank", "4", "--threads", "1"]
    args = train.parser().parse_args(["--output", str(out), *tiny])
    assert train.train(args) == out

    config = PeftConfig.from_pretrained(str(out))
    assert (config.peft_type, config.r) == ("LORA", 4)
    assert config.base_model_name_or_path == train.BASE_MODEL_ID
    adapter = read_peft_adapter(out)  # what the api's registry reads
    assert (adapter.rank, adapter.alpha) == (4, 8.0)
    assert adapter.target_modules == LLAMA_MODULES[:4]
    assert len(adapter.weights) == 30 * 4  # every layer of SmolLM2-135M, four projections
    q_a, q_b = adapter.weights[(0, "q_proj")]
    assert (q_a.shape, q_b.shape) == ((4, 576), (576, 4))
    # peft starts B at zero: a trained adapter has moved it.
    assert any(abs(b).max() > 0 for _, b in adapter.weights.values())
