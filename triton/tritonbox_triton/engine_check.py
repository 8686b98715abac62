"""Check a TensorRT-LLM engine's build (its `config.json`) and the GPUs against the settings.

The C++ backend would otherwise start and fail later, or clamp silently: a MAX_BATCH_SIZE above
the build is never reached, a prompt longer than the build's max_input_len fails per request, and
a wrong tensor parallelism fails deep inside MPI. Both config.json layouts are read: the unified
one (TensorRT-LLM >= 0.8: `pretrained_config.mapping` + `build_config`, with `max_seq_len` from
0.10 on) and the legacy one (`builder_config` + `plugin_config`, engines named per precision).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonbox_triton.settings import TritonSettings

log = logging.getLogger(__name__)

REBUILD = "rebuild the engine (scripts/build_engine.py) or change the setting"


class EngineCheckError(ValueError):
    """The engine or the machine does not fit the settings; the message names the setting."""


@dataclass(frozen=True)
class EngineBuild:
    """What an engine was built for; None where its config.json does not say."""

    max_batch_size: int | None
    max_input_len: int | None
    max_seq_len: int | None  # prompt + output tokens of one request
    tp_size: int
    pp_size: int
    plugins: dict[str, Any]
    engine_files: tuple[str, ...]


def _int(section: dict[str, Any], key: str) -> int | None:
    value = section.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_engine_build(engine_dir: Path) -> EngineBuild:
    """Parse `engine_dir/config.json` (either layout)."""
    path = engine_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise EngineCheckError(f"engine_dir: cannot read {path}: {error}") from None
    if not isinstance(config, dict):
        raise EngineCheckError(f"engine_dir: {path} is not a TensorRT-LLM engine config")
    if "builder_config" in config:  # legacy layout (TensorRT-LLM <= 0.7)
        build = config.get("builder_config") or {}
        tp = _int(build, "tensor_parallel") or 1
        pp = _int(build, "pipeline_parallel") or 1
        input_len, output_len = _int(build, "max_input_len"), _int(build, "max_output_len")
        name, precision = build.get("name", "model"), build.get("precision", "float16")
        suffix = f"_pp{pp}" if pp > 1 else ""
        files = [f"{name}_{precision}_tp{tp}{suffix}_rank{r}.engine" for r in range(tp * pp)]
        plugins = config.get("plugin_config") or {}
        seq_len = input_len + output_len if input_len and output_len else None
    else:
        build = config.get("build_config") or {}
        mapping = (config.get("pretrained_config") or {}).get("mapping") or {}
        tp, pp = _int(mapping, "tp_size") or 1, _int(mapping, "pp_size") or 1
        input_len = _int(build, "max_input_len")
        seq_len = _int(build, "max_seq_len")
        if seq_len is None and input_len and _int(build, "max_output_len"):  # 0.8 and 0.9
            seq_len = input_len + (_int(build, "max_output_len") or 0)
        files = [f"rank{rank}.engine" for rank in range(tp * pp)]
        plugins = build.get("plugin_config") or {}
    return EngineBuild(
        max_batch_size=_int(build, "max_batch_size"),
        max_input_len=input_len,
        max_seq_len=seq_len,
        tp_size=tp,
        pp_size=pp,
        plugins=plugins if isinstance(plugins, dict) else {},
        engine_files=tuple(files),
    )


def _enabled(value: Any) -> bool:
    # Plugins hold a dtype ("float16", "auto") when on and null when off; switches are booleans
    # or, in some versions, "enable"/"disable".
    return value not in (None, False, "disable", "disabled")


def check_engine(settings: TritonSettings, engine_dir: Path) -> EngineBuild:
    """Raise EngineCheckError naming the setting when the engine cannot serve these settings."""
    build = read_engine_build(engine_dir)
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
    # In-flight batching (gpt_model_type=inflight_fused_batching) needs these three.
    missing = [
        name
        for name in ("gpt_attention_plugin", "paged_kv_cache", "remove_input_padding")
        if name in build.plugins and not _enabled(build.plugins[name])
    ]
    if missing:
        raise EngineCheckError(
            f"the engine in {engine_dir} was built without {', '.join(missing)}: in-flight "
            "batching needs them (scripts/build_engine.py enables them)"
        )
    absent = [name for name in build.engine_files if not (engine_dir / name).is_file()]
    if absent:
        raise EngineCheckError(
            f"engine_dir: {engine_dir} lacks {', '.join(absent)} (one engine file per GPU)"
        )
    return build


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
