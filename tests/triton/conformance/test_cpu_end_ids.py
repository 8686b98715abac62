"""Every end id the checkpoint declares ends an answer on the cpu engine too, through the real
tritonserver: preprocessing sends the extra ids to the engine as one-token stop words, the same
tensors the TensorRT-LLM engine gets.

The default model's tokenizer files are copied with a generation_config.json that declares a
second end id, ".": SmolLM2's greedy answer to the prompt goes on after its first full stop
(transformers' greedy generate is the reference), and with the second end id it ends there,
the stop token included as TensorRT-LLM includes a stop word's tokens.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tritonbox_testing.reference import greedy_generate

from tritonbox_common.client import Generation, GenerationRequest, TritonLLMClient

PROMPT = "The capital of France is"
GREEDY = {"top_k": 1, "temperature": 1.0}


def generate(url: str, request: GenerationRequest) -> Generation:
    async def once() -> Generation:
        client = TritonLLMClient(url)
        try:
            return await client.generate(request)
        finally:
            await client.close()

    return asyncio.run(once())


def greedy_reference(model: Any, tokenizer: Any, max_tokens: int) -> list[int]:
    ids, _ = greedy_generate(model, tokenizer(PROMPT).input_ids, max_tokens)
    return ids


def test_the_cpu_engine_stops_on_every_declared_end_id(
    triton_launcher: Callable[..., Any],
    model: Any,
    tokenizer_dir: Path,
    tokenizer: Any,
    tmp_path: Path,
) -> None:
    (period,) = tokenizer.encode(".", add_special_tokens=False)
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, folder / name)
    ends = {"eos_token_id": [tokenizer.eos_token_id, period]}
    (folder / "generation_config.json").write_text(json.dumps(ends))
    reference = greedy_reference(model, tokenizer, 24)
    # The premise: without the second end id the answer runs past its first full stop.
    assert period in reference and reference.index(period) < len(reference) - 1
    request = GenerationRequest(PROMPT, max_tokens=24, sampling=GREEDY)
    with triton_launcher(tokenizer_dir=folder) as running:
        result = generate(running.grpc_url, request)
    stop = reference.index(period)
    assert result.ids == reference[: stop + 1], (result.ids, reference)
