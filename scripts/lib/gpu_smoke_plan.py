"""The GPU smoke test's plan (scripts/gpu_smoke): the engine build, the compose stack, and the
offline checks of its dry run. Running it is scripts/lib/gpu_smoke.py's part."""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import gpu_smoke_adapter as adapter
import gpu_smoke_checks as checks

from tritonbox_triton.engine_check import BUILD_IMAGE, TRTLLM_VERSION, check_engine
from tritonbox_triton.engine_lora import read_engine_lora
from tritonbox_triton.settings import DEFAULT_MODEL_NAME, TritonSettings

REPO = Path(__file__).resolve().parents[2]
PROJECT = "tritonbox-gpu-smoke"
CHECKPOINT = Path(".cache") / "models" / DEFAULT_MODEL_NAME
ENGINE_NAME = "gpu-smoke-smollm2-fp16"
LIMITS = {"MAX_BATCH_SIZE": 8, "MAX_INPUT_LEN": 512, "MAX_OUTPUT_LEN": 256}
# The engine's LoRA plugin rank: the smoke adapter's (gpu_smoke_adapter.RANK), and MAX_LORA_RANK.
LORA_RANK = adapter.RANK
# The smoke checkpoint's sizes (its config.json), for the dry run on a machine without it.
SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9}
SMOLLM2 |= {"num_key_value_heads": 3, "head_dim": 64, "num_hidden_layers": 30}


def build_arguments() -> list[str]:
    """build_engine.py's arguments, as paths inside the container (the repository at /work)."""
    return [
        f"--model=/work/{CHECKPOINT}",
        "--preset=fp16",
        f"--output=/work/models/{ENGINE_NAME}",
        f"--max-batch-size={LIMITS['MAX_BATCH_SIZE']}",
        f"--max-input-len={LIMITS['MAX_INPUT_LEN']}",
        f"--max-output-len={LIMITS['MAX_OUTPUT_LEN']}",
        "--tp=1",
        f"--max-lora-rank={LORA_RANK}",
    ]


def build_command() -> list[str]:
    # NVIDIA's recommended run flags for TensorRT-LLM containers.
    return [
        *("docker", "run", "--rm", "--gpus", "all", "--ipc=host"),
        *("--ulimit", "memlock=-1", "--ulimit", "stack=67108864"),
        *("-v", f"{REPO}:/work", "-w", "/work", BUILD_IMAGE),
        *("python3", "scripts/build_engine.py", *build_arguments()),
    ]


def compose_override() -> str:
    """Compose `environment:` wins over the `.env` env_file: a developer's own .env (a Gemma
    engine's limits, say) cannot leak into the smoke stack."""
    lines = ["services:", "  triton:", "    environment:"]
    values = LIMITS | {"KV_CACHE_MAX_TOKENS": 0, "ENABLE_KV_CACHE_REUSE": "false"}
    values |= {"MAX_LORA_RANK": LORA_RANK}
    lines += [f'      {key}: "{value}"' for key, value in values.items()]
    # The smoke adapter is written under ./models (the api's /models): an allowed adapter root.
    lines += ["  api:", "    environment:", '      ADAPTER_DIRS: "/models"']
    return "\n".join(lines) + "\n"


def compose(override: Path, *command: str) -> list[str]:
    return ["docker", "compose", "-p", PROJECT, "-f", "compose.yaml", "-f", str(override), *command]


def compose_environment(api_port: int, playground_port: int) -> dict[str, str]:
    return {
        "ENGINE_REPOSITORY": f"/models/{ENGINE_NAME}",
        "TENSOR_PARALLELISM": "1",
        "API_PORT": str(api_port),
        "PLAYGROUND_PORT": str(playground_port),
    }


def smoke_settings(engine_dir: Path) -> TritonSettings:
    """The triton service's settings in the smoke stack, for the engine check on the host."""
    factory: Any = TritonSettings  # mypy does not know BaseSettings' `_env_file` option
    values = {key.lower(): value for key, value in LIMITS.items()}
    values["max_lora_rank"] = LORA_RANK
    settings: TritonSettings = factory(
        _env_file=None,
        engine="trtllm",
        engine_dir=engine_dir,
        tritonserver_bin="/opt/tritonserver/bin/tritonserver",
        tensor_parallelism=1,
        **values,
    )
    return settings


def load_build_engine() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_engine", REPO / "scripts/build_engine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_engine"] = module
    spec.loader.exec_module(module)
    return module


def parse_flags(build_flags: list[str]) -> dict[str, str | list[str]]:
    """trtllm-build's `--key=value` flags, and `--key v1 v2` (nargs "+") as lists."""
    flags: dict[str, str | list[str]] = {}
    key = ""
    for flag in build_flags[1:]:
        if flag.startswith("--") and "=" in flag:
            key, value = flag.removeprefix("--").split("=", 1)
            flags[key] = value
        elif flag.startswith("--"):
            key = flag.removeprefix("--")
            flags[key] = []
        else:
            values = flags[key]
            assert isinstance(values, list), f"{flag} follows --{key}=..."
            values.append(flag)
    return flags


def expected_engine_config(build_flags: list[str]) -> dict[str, object]:
    """The parts of config.json the engine check and render read, as trtllm-build writes them
    for these flags (builder.py / plugin.py / lora_helper.py of TensorRT-LLM 0.20; see
    tests/data/trtllm_engines)."""
    flags: dict[str, Any] = parse_flags(build_flags)
    paged_context = flags.get("use_paged_context_fmha") == "enable"
    lora_plugin = flags.get("lora_plugin")
    lora: dict[str, object] = {
        "lora_dir": [],
        "lora_ckpt_source": "hf",
        "max_lora_rank": int(flags.get("max_lora_rank", 64)),
        "lora_target_modules": flags.get("lora_target_modules") or [],
        "trtllm_modules_to_hf_modules": {},
    }
    return {
        "version": TRTLLM_VERSION,
        "pretrained_config": {
            "dtype": "float16",  # the fp16 preset
            "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        },
        "build_config": {
            **{key: int(flags[key]) for key in ("max_batch_size", "max_input_len", "max_seq_len")},
            "max_num_tokens": int(flags["max_num_tokens"]),
            "kv_cache_type": flags["kv_cache_type"].upper(),
            "plugin_config": {
                "gpt_attention_plugin": flags["gpt_attention_plugin"],
                "paged_kv_cache": flags["kv_cache_type"] == "paged",
                "remove_input_padding": flags["remove_input_padding"] == "enable",
                "use_paged_context_fmha": paged_context,
                "lora_plugin": lora_plugin,
            },
            "lora_config": lora,
        },
    }


def smoke_adapter_rows(folder: Path) -> int:
    """Write the smoke adapter (the checkpoint's sizes, or SmolLM2-135M's without it) and
    convert it as the api will: one lora_weights row per (layer, module)."""
    from tritonbox_common.lora import read_peft_adapter, to_lora_tensors

    config_file = REPO / CHECKPOINT / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else SMOLLM2
    adapter.write_adapter(folder, adapter.make_weights(config), base_model="smoke-model")
    peft = read_peft_adapter(folder)
    if (peft.rank, set(peft.target_modules)) != (adapter.RANK, set(adapter.TARGETS)):
        raise AssertionError(f"the smoke adapter reads back as {peft}")
    weights, _ = to_lora_tensors(peft, "float16")
    return int(weights.shape[0])


def offline_checks() -> list[str]:
    """What can be proven without Docker or a GPU; raises on the first inconsistency."""
    build_engine = load_build_engine()
    args = build_engine.parse_args(build_arguments())
    flags = build_engine.build_command(args, Path("/tmp/ckpt"))
    with tempfile.TemporaryDirectory() as folder:
        engine = Path(folder)
        (engine / "config.json").write_text(json.dumps(expected_engine_config(flags)))
        (engine / "rank0.engine").write_bytes(b"")
        check_engine(smoke_settings(engine), engine, runtime=TRTLLM_VERSION)
        lora = read_engine_lora(engine)
        rows = smoke_adapter_rows(Path(folder) / "adapter")
    if lora.max_lora_rank < adapter.RANK or not set(adapter.TARGETS) <= set(lora.hf_modules):
        raise AssertionError(f"the smoke engine cannot serve the smoke adapter: {lora}")
    from pydantic import BaseModel

    from tritonbox_api.protocol.openai import ChatCompletionRequest, CompletionRequest
    from tritonbox_api.protocol.predictions import PredictionCreate

    models: dict[str, type[BaseModel]] = {
        "CompletionRequest": CompletionRequest,
        "ChatCompletionRequest": ChatCompletionRequest,
        "PredictionCreate": PredictionCreate,
    }
    bodies = checks.request_bodies("smoke-model", LIMITS["MAX_OUTPUT_LEN"])
    bodies["adapter"] = ("CompletionRequest", checks.completion(adapter.NAME))
    for model, body in bodies.values():
        models[model].model_validate(body)  # raises pydantic.ValidationError on drift
    return [
        "build_engine.py accepts the smoke build and emits: " + shlex.join(flags),
        "the engine that build describes passes the engine check with the smoke settings",
        f"it serves rank-{adapter.RANK} adapters on {' '.join(lora.hf_modules)}",
        f"the smoke adapter reads as PEFT and converts to {rows} lora_weights rows",
        f"the api accepts every smoke request ({', '.join(bodies)})",
    ]
