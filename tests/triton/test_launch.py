"""The tritonserver command line: one process, or `mpirun` with one rank per GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tritonbox_triton.launch import RANK_PORT_STRIDE, server_command
from tritonbox_triton.server import TritonServer
from tritonbox_triton.server_setup import server_environment
from tritonbox_triton.settings import TritonSettings

BIN = Path("/opt/tritonserver/bin/tritonserver")
REPOSITORY = Path("/cache/model_repository")


def command(settings: TritonSettings, **values: Any) -> list[str]:
    return server_command(
        settings.model_copy(update=values),
        executable=BIN,
        model_repository=REPOSITORY,
        backend_directory=None,
    )


def ranks(argv: list[str]) -> list[list[str]]:
    """The per-rank argument lists of an `mpirun … : …` command."""
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    groups: list[list[str]] = [[]]
    for word in argv[2:]:
        if word == ":":
            groups.append([])
        else:
            groups[-1].append(word)
    return groups


def test_single_gpu_is_one_process(trtllm: TritonSettings) -> None:
    argv = command(trtllm, triton_host="0.0.0.0")
    assert argv[0] == str(BIN)
    assert f"--model-repository={REPOSITORY}" in argv
    assert "--disable-auto-complete-config" in argv
    assert "--http-address=0.0.0.0" in argv
    assert not any(a.startswith(("--backend-directory", "--id", "--backend-config")) for a in argv)


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallelism_runs_one_rank_per_gpu(trtllm: TritonSettings, tp: int) -> None:
    s = trtllm.model_copy(update={"tensor_parallelism": tp, "triton_host": "0.0.0.0"})
    groups = ranks(command(s))
    assert len(groups) == tp
    for rank, arguments in enumerate(groups):
        assert arguments[:3] == ["-n", "1", str(BIN)]
        rest = arguments[3:]
        assert f"--model-repository={REPOSITORY}" in rest
        assert f"--id=rank{rank}" in rest
        assert f"--backend-config=python,shm-region-prefix-name=prefix{rank}_" in rest
        assert "--disable-auto-complete-config" in rest
        assert "--exit-timeout-secs=2" in rest
        if rank == 0:
            # Rank 0 serves the whole ensemble where clients reach it.
            assert f"--grpc-port={s.triton_grpc_port}" in rest
            assert f"--http-port={s.triton_http_port}" in rest
            assert "--grpc-address=0.0.0.0" in rest
            assert not any(a.startswith(("--model-control-mode", "--load-model")) for a in rest)
        else:
            # Other ranks load only the engine and serve nothing, on ports of their own.
            assert "--model-control-mode=explicit" in rest
            assert [a for a in rest if a.startswith("--load-model")] == [
                "--load-model=tensorrt_llm"
            ]
            for flag in ("--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"):
                assert flag in rest
            offset = rank * RANK_PORT_STRIDE
            assert f"--http-port={s.triton_http_port + offset}" in rest
            assert f"--grpc-port={s.triton_grpc_port + offset}" in rest
            assert f"--metrics-port={s.triton_metrics_port + offset}" in rest
    prefixes = {a for group in groups for a in group if "shm-region-prefix-name" in a}
    assert len(prefixes) == tp


def test_exact_command_for_two_gpus(trtllm: TritonSettings) -> None:
    s = trtllm.model_copy(
        update={
            "tensor_parallelism": 2,
            "triton_host": "0.0.0.0",
            "triton_http_port": 8000,
            "triton_grpc_port": 8001,
            "triton_metrics_port": 8002,
        }
    )
    assert " ".join(command(s)) == (
        "mpirun --allow-run-as-root"
        f" -n 1 {BIN} --model-repository={REPOSITORY}"
        " --http-address=0.0.0.0 --http-port=8000 --grpc-address=0.0.0.0 --grpc-port=8001"
        " --metrics-address=0.0.0.0 --metrics-port=8002 --log-verbose=0"
        " --disable-auto-complete-config --id=rank0"
        " --backend-config=python,shm-region-prefix-name=prefix0_ --exit-timeout-secs=2"
        f" : -n 1 {BIN} --model-repository={REPOSITORY}"
        " --model-control-mode=explicit --load-model=tensorrt_llm"
        " --http-port=8010 --grpc-port=8011 --metrics-port=8012"
        " --allow-http=false --allow-grpc=false --allow-metrics=false"
        " --log-info=false --log-warning=false"
        " --disable-auto-complete-config --id=rank1"
        " --backend-config=python,shm-region-prefix-name=prefix1_ --exit-timeout-secs=2"
    )


def test_cpu_engine_ignores_tensor_parallelism(cpu: TritonSettings) -> None:
    argv = command(cpu, tensor_parallelism=4)
    assert argv[0] == str(BIN)
    assert "--disable-auto-complete-config" not in argv  # the cpu models complete nothing either


def test_nvidia_binary_brings_its_own_backends(trtllm: TritonSettings, tmp_path: Path) -> None:
    settings = trtllm.model_copy(update={"tritonserver_bin": BIN, "tensor_parallelism": 2})
    server = TritonServer(settings, model_repository=tmp_path)
    assert server.executable == BIN and not server.bundled
    argv = server.command()
    assert argv[0] == "mpirun" and str(BIN) in argv
    assert not any(a.startswith("--backend-directory") for a in argv)
    env = server_environment(
        {"LD_LIBRARY_PATH": "/opt/hpcx/lib", "PATH": "/usr/bin"}, bundled=False
    )
    assert env["LD_LIBRARY_PATH"] == "/opt/hpcx/lib" and env["PATH"] == "/usr/bin"
    assert env["PYTHONSAFEPATH"] == "1"
