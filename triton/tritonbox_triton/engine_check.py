"""Check a TensorRT-LLM engine's build (its `config.json`) and the GPUs against the settings.

The C++ backend would otherwise start and fail later, or clamp silently: an engine from another
TensorRT-LLM version dies inside TensorRT with an obscure deserialisation error, a MAX_BATCH_SIZE
above the build is never reached, a prompt longer than the build's max_input_len or
max_num_tokens fails per request, KV-cache reuse without paged context FMHA fails at load, and a
wrong tensor parallelism fails deep inside MPI. config.json is written by `trtllm-build`
(`EngineConfig.to_dict` in tensorrt_llm/builder.py): `version`, `pretrained_config` (with
`mapping` and `quantization`) and `build_config` (with `plugin_config`).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from tritonbox_triton.settings import TritonSettings

log = logging.getLogger(__name__)

# The TensorRT-LLM of the serving image (nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3);
# a test keeps it equal to triton/Dockerfile's base image. An engine is a serialised TensorRT
# plan: only the TensorRT-LLM (and TensorRT) version that built it can load it.
TRTLLM_VERSION = "0.20.0"
# Guided decoding's tokenizer info in an engine folder (scripts/build_engine.py writes it, as
# TensorRT-LLM's examples/generate_xgrammar_tokenizer_info.py does); render.py turns guided
# decoding on when it is there.
XGRAMMAR_TOKENIZER_INFO = "xgrammar_tokenizer_info.json"
BUILD_IMAGE = f"nvcr.io/nvidia/tensorrt-llm/release:{TRTLLM_VERSION}"
REBUILD = "rebuild the engine (scripts/build_engine.py) or change the setting"
# Bytes per KV-cache element by kv_cache_quant_algo; None = the model's dtype.
_KV_BYTES = {"INT8": 1, "FP8": 1}
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


class EngineCheckError(ValueError):
    """The engine or the machine does not fit the settings; the message names the setting."""


@dataclass(frozen=True)
class EngineBuild:
    """What an engine was built for; None where its config.json does not say."""

    version: str | None
    max_batch_size: int | None
    max_input_len: int | None
    max_seq_len: int | None  # prompt + output tokens of one request
    max_num_tokens: int | None  # tokens one engine step takes (all requests together)
    kv_cache_type: str | None  # PAGED, CONTINUOUS or DISABLED (0.12+)
    tp_size: int
    pp_size: int
    plugins: dict[str, Any]
    kv_bytes_per_token: int | None  # one token's K and V over all layers, on one GPU
    engine_files: tuple[str, ...]


def _int(section: dict[str, Any], key: str) -> int | None:
    value = section.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _section(config: dict[str, Any], key: str) -> dict[str, Any]:
    value = config.get(key)
    return value if isinstance(value, dict) else {}


def _kv_bytes_per_token(pretrained: dict[str, Any], tp: int) -> int | None:
    """K and V of one token in all layers, per GPU (KV heads are split over the TP ranks)."""
    layers, heads = _int(pretrained, "num_hidden_layers"), _int(pretrained, "num_key_value_heads")
    head_size = _int(pretrained, "head_size")
    algo = _section(pretrained, "quantization").get("kv_cache_quant_algo")
    element = _KV_BYTES.get(str(algo)) if algo else _DTYPE_BYTES.get(pretrained.get("dtype", ""))
    if not (layers and heads and head_size and element):
        return None
    return 2 * layers * max(heads // tp, 1) * head_size * element


def read_engine_build(engine_dir: Path) -> EngineBuild:
    """Parse `engine_dir/config.json`."""
    path = engine_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise EngineCheckError(f"engine_dir: cannot read {path}: {error}") from None
    if not isinstance(config, dict):
        raise EngineCheckError(f"engine_dir: {path} is not a TensorRT-LLM engine config")
    # TensorRT-LLM <= 0.7 wrote `builder_config` and no version: too old for this image anyway.
    build = _section(config, "build_config")
    pretrained = _section(config, "pretrained_config")
    mapping = _section(pretrained, "mapping")
    tp, pp = _int(mapping, "tp_size") or 1, _int(mapping, "pp_size") or 1
    input_len, seq_len = _int(build, "max_input_len"), _int(build, "max_seq_len")
    if seq_len is None and input_len and _int(build, "max_output_len"):  # 0.8 and 0.9
        seq_len = input_len + (_int(build, "max_output_len") or 0)
    version = config.get("version")
    kv_cache_type = build.get("kv_cache_type")
    return EngineBuild(
        version=version if isinstance(version, str) else None,
        max_batch_size=_int(build, "max_batch_size"),
        max_input_len=input_len,
        max_seq_len=seq_len,
        max_num_tokens=_int(build, "max_num_tokens"),
        kv_cache_type=kv_cache_type if isinstance(kv_cache_type, str) else None,
        tp_size=tp,
        pp_size=pp,
        plugins=_section(build, "plugin_config"),
        kv_bytes_per_token=_kv_bytes_per_token(pretrained, tp),
        engine_files=tuple(f"rank{rank}.engine" for rank in range(tp * pp)),
    )


def runtime_version() -> str:
    """The TensorRT-LLM that will load the engine: the installed package, else the image's."""
    for name in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return TRTLLM_VERSION


def _enabled(value: Any) -> bool:
    # Plugins hold a dtype ("float16", "auto") when on and null when off; switches are booleans
    # or, in some versions, "enable"/"disable".
    return value not in (None, False, "disable", "disabled")


def _release(version: str | None) -> str | None:
    # A local build tag ("0.20.0+abc") names the same release as "0.20.0".
    return version.split("+", 1)[0] if version else None


def _check_version(build: EngineBuild, engine_dir: Path, runtime: str) -> None:
    if _release(build.version) == _release(runtime):
        return
    built = f"TensorRT-LLM {build.version}" if build.version else "an unknown TensorRT-LLM"
    raise EngineCheckError(
        f"the engine in {engine_dir} was built by {built} (config.json version "
        f"{build.version!r}), this image runs TensorRT-LLM {runtime}: an engine loads only in "
        f"the version that built it; rebuild it with scripts/build_engine.py in {BUILD_IMAGE}"
    )


def _check_limits(settings: TritonSettings, build: EngineBuild) -> None:
    for key, wanted, built in (
        ("MAX_BATCH_SIZE", settings.max_batch_size, build.max_batch_size),
        ("MAX_INPUT_LEN", settings.max_input_len, build.max_input_len),
    ):
        if built is not None and wanted > built:
            raise EngineCheckError(
                f"{key}={wanted} is more than the engine was built for ({built}); {REBUILD}"
            )
    longest = settings.max_input_len + settings.max_output_len
    if build.max_seq_len is not None and longest > build.max_seq_len:
        room = build.max_seq_len - settings.max_input_len
        raise EngineCheckError(
            f"MAX_OUTPUT_LEN={settings.max_output_len} with MAX_INPUT_LEN="
            f"{settings.max_input_len} needs sequences of {longest} tokens, more than the engine "
            f"was built for (max_seq_len {build.max_seq_len}): set MAX_OUTPUT_LEN to at most "
            f"{max(room, 0)} or {REBUILD}"
        )
    # TritonBox serves without chunked context, so a whole prompt must fit one engine step.
    if build.max_num_tokens is not None and settings.max_input_len > build.max_num_tokens:
        raise EngineCheckError(
            f"MAX_INPUT_LEN={settings.max_input_len} is more than the engine's max_num_tokens "
            f"({build.max_num_tokens}, the tokens of one engine step); without chunked context a "
            f"prompt must fit one step: set MAX_INPUT_LEN to at most {build.max_num_tokens} or "
            f"rebuild with --max-num-tokens {settings.max_input_len} or more"
        )


def _check_features(settings: TritonSettings, build: EngineBuild, engine_dir: Path) -> None:
    # In-flight batching (gpt_model_type=inflight_fused_batching) needs these three.
    missing: list[str] = [
        name
        for name in ("gpt_attention_plugin", "paged_kv_cache", "remove_input_padding")
        if name in build.plugins and not _enabled(build.plugins[name])
    ]
    if build.kv_cache_type not in (None, "PAGED") and "paged_kv_cache" not in missing:
        missing.append(f"paged_kv_cache (kv_cache_type {build.kv_cache_type})")
    if missing:
        raise EngineCheckError(
            f"the engine in {engine_dir} was built without {', '.join(missing)}: in-flight "
            "batching needs them (scripts/build_engine.py enables them)"
        )
    paged_context = build.plugins.get("use_paged_context_fmha")
    if settings.enable_kv_cache_reuse and paged_context is not None and not _enabled(paged_context):
        raise EngineCheckError(
            "ENABLE_KV_CACHE_REUSE=true needs an engine built with paged context FMHA, and the "
            f"engine in {engine_dir} has use_paged_context_fmha={paged_context} (engines with an "
            "INT8 KV cache cannot have it): set ENABLE_KV_CACHE_REUSE=false, or rebuild without "
            "--kv-cache int8 (no KV-cache quantisation, or --preset fp8 --kv-cache fp8)"
        )


def check_engine(
    settings: TritonSettings, engine_dir: Path, runtime: str | None = None
) -> EngineBuild:
    """Raise EngineCheckError naming the setting when the engine cannot serve these settings.

    `runtime` is the TensorRT-LLM version that will load the engine (default: runtime_version).
    """
    build = read_engine_build(engine_dir)
    _check_version(build, engine_dir, runtime or runtime_version())
    _check_limits(settings, build)
    if build.tp_size != settings.tensor_parallelism:
        raise EngineCheckError(
            f"TENSOR_PARALLELISM={settings.tensor_parallelism} but the engine in {engine_dir} "
            f"was built for {build.tp_size} (tp_size): set TENSOR_PARALLELISM={build.tp_size}"
        )
    if build.pp_size != 1:
        raise EngineCheckError(
            f"the engine in {engine_dir} uses pipeline parallelism (pp_size={build.pp_size}), "
            "which TritonBox does not launch: rebuild it with --pp_size 1"
        )
    _check_features(settings, build, engine_dir)
    absent = [name for name in build.engine_files if not (engine_dir / name).is_file()]
    if absent:
        raise EngineCheckError(
            f"engine_dir: {engine_dir} lacks {', '.join(absent)} (one engine file per GPU)"
        )
    log_kv_sizing(settings, build)
    return build


def full_batch_tokens(settings: TritonSettings) -> int:
    """KV-cache tokens that MAX_BATCH_SIZE requests of the longest allowed size hold."""
    return settings.max_batch_size * (settings.max_input_len + settings.max_output_len)


def log_kv_sizing(settings: TritonSettings, build: EngineBuild) -> None:
    """Say what a full batch needs, and warn when a token cap makes it unreachable."""
    tokens = full_batch_tokens(settings)
    if build.kv_bytes_per_token:
        gib = tokens * build.kv_bytes_per_token / 2**30
        log.info(
            "a full batch (%d x %d tokens) needs %d KV-cache tokens, %.1f GiB per GPU",
            settings.max_batch_size,
            settings.max_input_len + settings.max_output_len,
            tokens,
            gib,
        )
    cap = settings.kv_cache_max_tokens
    if cap and cap < tokens:
        log.warning(
            "KV_CACHE_MAX_TOKENS=%d holds about %d of MAX_BATCH_SIZE=%d requests of %d tokens; "
            "the rest wait (guaranteed_no_evict). Set KV_CACHE_MAX_TOKENS=0 to size the cache by "
            "KV_CACHE_FREE_GPU_MEM_FRACTION",
            cap,
            cap // (settings.max_input_len + settings.max_output_len),
            settings.max_batch_size,
            settings.max_input_len + settings.max_output_len,
        )


def visible_gpus() -> int | None:
    """GPUs this process can use (`nvidia-smi -L`); None when nvidia-smi is not there."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return None
    try:
        listing = subprocess.run(
            [nvidia_smi, "-L"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("nvidia-smi -L failed (%s): counting no GPU", error)
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def check_gpus(settings: TritonSettings, count: int | None) -> None:
    """One GPU per tensor-parallel rank; `count` None = cannot tell (warn, let Triton decide)."""
    wanted = settings.tensor_parallelism
    if count is None:
        log.warning("nvidia-smi not found: cannot check for %d GPU(s)", wanted)
        return
    if count < wanted:
        raise EngineCheckError(
            f"TENSOR_PARALLELISM={wanted} needs {wanted} GPU(s), {count} visible: give the "
            "container the GPUs (compose reserves TENSOR_PARALLELISM of them) or use the cpu "
            "engine (ENGINE=cpu)"
        )
    if count > wanted:
        log.warning(
            "%d GPUs visible, the engine uses %d (TENSOR_PARALLELISM); choose which with "
            "CUDA_VISIBLE_DEVICES",
            count,
            wanted,
        )
