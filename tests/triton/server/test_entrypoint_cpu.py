"""The cpu flavour for real through the containers' entrypoint (`python -m tritonbox_triton
serve`): the real tritonserver of the wheel, the default model, a real gRPC generation."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tritonbox_testing.entrypoint import serve_environment, serving
from tritonbox_testing.ports import free_ports

from tritonbox_common.client import GenerationRequest, TritonLLMClient

REPO = Path(__file__).resolve().parents[3]


async def greedy(url: str, prompt: str) -> str:
    client = TritonLLMClient(url)
    try:
        request = GenerationRequest(prompt=prompt, max_tokens=8, sampling={"temperature": 0.0})
        return (await client.generate(request)).text
    finally:
        await client.close()


def test_serve_cpu_engine(tmp_path: Path, tokenizer_dir: Path) -> None:
    http, grpc, metrics = free_ports(3)
    settings = {
        "ENGINE": "cpu",
        "CACHE_DIR": str(REPO / ".cache"),  # the default model, prepared once per machine
        "MODEL_REPOSITORY": str(tmp_path / "model_repository"),
        "MAX_INPUT_LEN": "512",
        "MAX_OUTPUT_LEN": "512",
        "TRITON_HTTP_PORT": str(http),
        "TRITON_GRPC_PORT": str(grpc),
        "TRITON_METRICS_PORT": str(metrics),
    }
    with serving(serve_environment(settings), tmp_path, timeout_s=300) as output:
        assert "(cpu engine" in output[-1]
        text = asyncio.run(greedy(f"127.0.0.1:{grpc}", "The capital of France is"))
        assert "Paris" in text
