"""Render the Triton model repository from the `${placeholder}` templates in `triton/models`.

NVIDIA's fill_template uses `safe_substitute`: a mistyped placeholder survives into the config
and the backend quietly falls back to a default. Here every placeholder must have a value, and
every value is checked before anything is written.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from tritonbox_common.ensemble import ENGINE_MODEL, ENSEMBLE_MODEL, PIPELINE_MODELS
from tritonbox_common.lora import LLAMA_MODULES
from tritonbox_triton.engine_check import XGRAMMAR_TOKENIZER_INFO, EngineCheckError, check_engine
from tritonbox_triton.engine_logits import logits_values
from tritonbox_triton.engine_lora import lora_values
from tritonbox_triton.settings import EngineFlavour, TritonSettings

log = logging.getLogger(__name__)

ENSEMBLE_MODELS = (ENSEMBLE_MODEL, *PIPELINE_MODELS)
# The folder each flavour's engine step is rendered from; it is always served as ENGINE_MODEL.
ENGINE_TEMPLATES = {
    EngineFlavour.TRTLLM: "tensorrt_llm",
    EngineFlavour.CPU: "tensorrt_llm_cpu",
    EngineFlavour.SYNTHETIC: "tensorrt_llm_synthetic",
}
CONFIG_FILE = "config.pbtxt"
# Written last into a finished repository; only a folder holding it is ever cleared.
MARKER = ".tritonbox-rendered"

# A placeholder never spans lines, so an unclosed `${` cannot swallow the rest of the file.
_PLACEHOLDER = re.compile(r"\$\{([^}\n]*)\}")
# The model's own name is the only `name:` at the start of a line; inputs' names are indented.
_NAME = re.compile(r'^name:\s*"([^"]*)"', re.MULTILINE)


class RenderError(ValueError):
    """The repository cannot be rendered; the message names the key, value or file."""


def templates_dir() -> Path:
    """The `triton/models` folder next to this package."""
    return _default_templates()


def _default_templates() -> Path:
    # A separate name because render_repository's `templates_dir` argument shadows the function.
    return Path(__file__).resolve().parent.parent / "models"


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _existing_dir(key: str, path: Path, *, needs: tuple[str, ...] = ()) -> str:
    if not path.is_dir():
        raise RenderError(f"{key}: {path} is not a directory")
    missing = [name for name in needs if not (path / name).exists()]
    if missing:
        raise RenderError(f"{key}: {path} has no {' or '.join(missing)}")
    return str(path)


def _tokenizer_dir(path: Path) -> str:
    value = _existing_dir("tokenizer_dir", path)
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise RenderError(f"tokenizer_dir: {path} has no tokenizer.json or tokenizer_config.json")
    return value


def _check_engine_build(settings: TritonSettings, engine_dir: Path) -> None:
    """Compare the settings with what the engine was built for (its config.json)."""
    try:
        check_engine(settings, engine_dir)
    except EngineCheckError as error:
        raise RenderError(str(error)) from None


def _engine_values(settings: TritonSettings) -> dict[str, str]:
    if settings.engine is EngineFlavour.SYNTHETIC:
        # No model: only the pace; the tokenizer (shared with pre/postprocessing) gives its text.
        return {
            "synthetic_token_interval_s": str(settings.synthetic_token_interval_s),
        }
    if settings.engine is EngineFlavour.CPU:
        return {
            "model_dir": _existing_dir(
                "model_dir", settings.resolved_model_dir, needs=("config.json",)
            ),
            "max_tokens_in_paged_kv_cache": str(settings.kv_cache_max_tokens),
            "cpu_threads": str(settings.cpu_threads),
            "cpu_dtype": settings.cpu_dtype,
            "kernel_dir": str(settings.cache_dir.resolve() / "kernels"),  # engine/fused_ops.py
            "max_lora_rank": str(settings.max_lora_rank),
            "lora_target_modules": " ".join(LLAMA_MODULES),  # every Llama projection
            "lora_cache_host_memory_bytes": str(settings.lora_cache_host_memory_bytes),
            "guide_compile_timeout_s": str(settings.guide_compile_timeout_s),  # guide_pool.py
        }
    if settings.engine_dir is None:
        raise RenderError("ENGINE_REPOSITORY: required for ENGINE=trtllm")
    engine_dir = settings.engine_dir.resolve()
    values = {"engine_dir": _existing_dir("engine_dir", engine_dir, needs=("config.json",))}
    _check_engine_build(settings, engine_dir)
    # The adapters the engine's build allows, and its LoRA cache (engine_lora.py).
    values |= lora_values(settings, engine_dir)
    # Guided decoding (structured output) when the build left xgrammar's tokenizer info.
    info = engine_dir / XGRAMMAR_TOKENIZER_INFO
    values |= {
        "guided_decoding_backend": "xgrammar" if info.is_file() else "",
        "xgrammar_tokenizer_info_path": str(info) if info.is_file() else "",
    }
    # Context logits (the prompt's log-probs for `echo`): their dtype, and whether it has them.
    values |= logits_values(engine_dir)
    return values | {
        # The backend reads an empty value as "no token limit, use the memory fraction".
        "max_tokens_in_paged_kv_cache": str(settings.kv_cache_max_tokens or ""),
        "kv_cache_free_gpu_mem_fraction": str(settings.kv_cache_free_gpu_mem_fraction),
        "batching_strategy": "inflight_fused_batching",
        "enable_kv_cache_reuse": _bool(settings.enable_kv_cache_reuse),
        "max_beam_width": "1",
        "batch_scheduler_policy": "guaranteed_no_evict",
        "enable_chunked_context": "false",
    }


def placeholder_values(settings: TritonSettings) -> dict[str, str]:
    """Every placeholder the flavour's templates may use, each value validated."""
    # The engine's values first: on the cpu flavour the tokenizer defaults to the model's folder,
    # and a wrong model folder should be reported as such.
    values = _engine_values(settings) | {
        "triton_max_batch_size": str(settings.max_batch_size),
        "decoupled_mode": _bool(settings.decoupled_mode),
        "tokenizer_dir": _tokenizer_dir(settings.resolved_tokenizer_dir),
        "preprocessing_instance_count": str(settings.preprocessing_instance_count),
        "postprocessing_instance_count": str(settings.postprocessing_instance_count),
        "max_queue_delay_microseconds": str(settings.max_queue_delay_microseconds),
        "max_queue_size": str(settings.max_queue_size),
        "max_input_len": str(settings.max_input_len),
        "max_output_len": str(settings.max_output_len),
        # Clients that want the prompt echoed send exclude_input_in_output=false per request.
        "exclude_input_in_output": "true",
    }
    # The ensemble declares lora_weights as its engine step does: the GPU engine's dtype
    # (engine_lora.py), float32 for the cpu engine (no half-precision adapters on CPU).
    values.setdefault("lora_weights_data_type", "TYPE_FP32")
    values.setdefault("logits_data_type", "TYPE_FP32")  # the ensemble's context_logits: cpu's
    for key, value in values.items():
        # A quote, backslash or newline would end or corrupt the pbtxt string it lands in.
        if any(char in value for char in '"\\\n\r'):
            raise RenderError(f"{key}: {value!r} contains a quote, backslash or line break")
    return values


def render_text(text: str, values: Mapping[str, str], source: Path) -> str:
    """Substitute every `${name}` in `text`; `source` only names the file in errors."""
    names = _PLACEHOLDER.findall(text)
    if text.count("${") != len(names):
        raise RenderError(f"{source}: a `${{` is never closed with `}}`")
    unknown = sorted({name for name in names if name not in values})
    if unknown:
        raise RenderError(
            f"{source}: no value for placeholder(s) {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(sorted(values))})"
        )
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], text)


def _copy_model(source: Path, target: Path, name: str, values: Mapping[str, str]) -> None:
    config = source / CONFIG_FILE
    if not config.is_file():
        raise RenderError(f"{config}: the template is missing")
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    rendered = render_text(config.read_text(), values, config)
    declared = _NAME.search(rendered)
    if declared is not None and declared.group(1) != name:
        raise RenderError(f"{config}: declares name {declared.group(1)!r}, served as {name!r}")
    (target / CONFIG_FILE).write_text(rendered)
    # Triton loads the highest version folder; the C++ backend needs one even if it is empty.
    (target / "1").mkdir(exist_ok=True)


def _clear(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise RenderError(f"{out_dir} is a file, not a model repository folder")
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / MARKER).is_file():
        raise RenderError(
            f"{out_dir} is not empty and is not a rendered model repository: refusing to clear it"
        )
    shutil.rmtree(out_dir, ignore_errors=True)


def render_repository(
    settings: TritonSettings, templates_dir: Path | None = None, out_dir: Path | None = None
) -> Path:
    """Render the flavour's four models into `out_dir` (default: the settings' repository).

    The previous contents are replaced only after the new repository rendered completely.
    """
    source = (templates_dir or _default_templates()).resolve()
    target = (out_dir or settings.resolved_model_repository).resolve()
    if source == target or source in target.parents or target in source.parents:
        raise RenderError(f"the output {target} and the templates {source} must not overlap")
    values = placeholder_values(settings)
    models = {name: source / name for name in ENSEMBLE_MODELS}
    models[ENGINE_MODEL] = source / ENGINE_TEMPLATES[settings.engine]

    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for name, model_source in models.items():
            _copy_model(model_source, staging / name, name, values)
        (staging / MARKER).write_text(f"{settings.engine.value}\n")
        _clear(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("rendered the %s model repository into %s", settings.engine.value, target)
    return target
