"""The `tritonserver` command line: one process, or one rank per GPU under `mpirun`.

Tensor parallelism follows NVIDIA's launch_triton_server.py: `mpirun` starts one `tritonserver`
per rank; rank 0 serves the whole ensemble, ranks > 0 load only the engine step (explicit model
control) and serve nothing, each with its own Python-backend shared-memory prefix so that the
ranks' stubs do not collide.
"""

from __future__ import annotations

from pathlib import Path

from tritonbox_common.ensemble import ENGINE_MODEL
from tritonbox_triton.settings import EngineFlavour, TritonSettings

# Open streams hold shutdown for this long; Triton's default (30 s) stalls every restart.
EXIT_TIMEOUT_S = 5
# Ranks > 0 serve nothing, but get ports of their own all the same (NVIDIA's scripts do too), so
# a rank can never race rank 0 for its ports.
RANK_PORT_STRIDE = 10


def uses_mpi(settings: TritonSettings) -> bool:
    """Only a TensorRT-LLM engine is split over GPUs; the cpu engine is one process."""
    return settings.engine is EngineFlavour.TRTLLM and settings.tensor_parallelism > 1


def _ports(settings: TritonSettings, rank: int) -> list[str]:
    offset = rank * RANK_PORT_STRIDE
    return [
        f"--http-port={settings.triton_http_port + offset}",
        f"--grpc-port={settings.triton_grpc_port + offset}",
        f"--metrics-port={settings.triton_metrics_port + offset}",
    ]


def server_arguments(
    settings: TritonSettings,
    model_repository: Path,
    backend_directory: Path | None,
    rank: int = 0,
    shm_prefix: str | None = None,
) -> list[str]:
    """The options of one `tritonserver` (rank 0 = the one clients talk to).

    `shm_prefix`: how the names of its Python-backend shared-memory regions begin, so that the
    launcher can tell its own from other servers' and remove what a killed server left.
    """
    s = settings
    arguments = [f"--model-repository={model_repository}"]
    if backend_directory is not None:  # NVIDIA's image finds its own (TensorRT-LLM's included)
        arguments.append(f"--backend-directory={backend_directory}")
    if rank == 0:
        arguments += [
            f"--http-address={s.triton_host}",
            f"--http-port={s.triton_http_port}",
            f"--grpc-address={s.triton_host}",
            f"--grpc-port={s.triton_grpc_port}",
            f"--metrics-address={s.triton_host}",
            f"--metrics-port={s.triton_metrics_port}",
            f"--log-verbose={s.triton_log_verbose}",
        ]
    else:
        arguments += [
            "--model-control-mode=explicit",
            f"--load-model={ENGINE_MODEL}",
            *_ports(settings, rank),
            "--allow-http=false",
            "--allow-grpc=false",
            "--allow-metrics=false",
            "--log-info=false",
            "--log-warning=false",
        ]
    if s.engine is EngineFlavour.TRTLLM:
        # The rendered configs are complete; letting the backend "complete" them can only differ.
        arguments.append("--disable-auto-complete-config")
    if uses_mpi(settings):
        arguments.append(f"--id=rank{rank}")
        shm_prefix = f"{shm_prefix or 'prefix'}{rank}_"
    if shm_prefix:
        arguments.append(f"--backend-config=python,shm-region-prefix-name={shm_prefix}")
    arguments.append(f"--exit-timeout-secs={EXIT_TIMEOUT_S}")
    return arguments


def server_command(
    settings: TritonSettings,
    *,
    executable: Path,
    model_repository: Path,
    backend_directory: Path | None,
    mpirun: str = "mpirun",
    shm_prefix: str | None = None,
) -> list[str]:
    """The whole command: `tritonserver …`, or `mpirun -n 1 tritonserver … : -n 1 …`."""
    if not uses_mpi(settings):
        arguments = server_arguments(
            settings, model_repository, backend_directory, shm_prefix=shm_prefix
        )
        return [str(executable), *arguments]
    # Containers often run as root; Open MPI refuses that without the flag.
    command = [mpirun, "--allow-run-as-root"]
    for rank in range(settings.tensor_parallelism):
        if rank:
            command.append(":")
        command += ["-n", "1", str(executable)]
        command += server_arguments(
            settings, model_repository, backend_directory, rank, shm_prefix=shm_prefix
        )
    return command
