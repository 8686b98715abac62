"""Check a trained demo adapter with transformers + peft, outside TritonBox (docs/adapters.md).

Greedy answers, through the model's chat template, to prompts the adapter never saw in training
(`UNSEEN_PROMPTS`), with the adapter and with the bare base side by side. Exits 1 unless every
adapter answer opens with "Ahoy, matey!" and no base answer does. With `--engine`, the same
prompts also go through a tritonserver on the cpu engine (gRPC to the `tensorrt_llm` step with
the adapter's LoRA tensors, each adapter request beside its base twin), whose greedy answers
must equal peft's. Usage (from the repo root):

    scripts/train_demo_adapter --check-only [--adapter .cache/adapters/demo] [--engine]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from tritonclient.grpc import InferResult

from tritonbox_common.client import GenerationRequest, TritonLLMClient, build_inputs
from tritonbox_common.lora import read_peft_adapter, to_lora_tensors

REPO = Path(__file__).resolve().parents[2]
# The repo root for `scripts.…`; tests/support for the port helper benchmarks/servers.py uses.
sys.path += [str(REPO), str(REPO / "tests" / "support")]
from scripts.benchmarks.lora_support import lora_inputs  # noqa: E402
from scripts.benchmarks.servers import start_cpu_engine  # noqa: E402
from scripts.demo_adapter.data import OPENER, UNSEEN_PROMPTS  # noqa: E402
from scripts.demo_adapter.train import DEFAULT_MODEL, DEFAULT_OUTPUT, idle_cores  # noqa: E402

sys.path.remove(str(REPO))
sys.path.remove(str(REPO / "tests" / "support"))


def answer(model: PeftModel, tokenizer: PreTrainedTokenizerBase, prompt: str, tokens: int) -> str:
    ids = torch.tensor([chat(tokenizer, prompt)])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, max_new_tokens=tokens, do_sample=False)
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def chat(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(str(text), add_special_tokens=False).input_ids)


async def engine_answers(
    url: str, tokenizer: PreTrainedTokenizerBase, adapter: Path, tokens: int
) -> list[tuple[str, str]]:
    """(with the adapter, base) greedy answers from the engine, the two requests at once."""
    peft_adapter = read_peft_adapter(adapter)
    first = lora_inputs(peft_adapter, to_lora_tensors(peft_adapter, np.float32), "FP32")
    later = lora_inputs(peft_adapter, None, "FP32")  # the engine has it cached by then
    client = TritonLLMClient(url)

    async def one(ids: list[int], lora: list[Any]) -> str:
        request = GenerationRequest(
            "", tokens, sampling={"top_k": 1}, model="tensorrt_llm", input_ids=ids
        )
        # TritonLLMClient has no LoRA inputs of its own: its stream opener with ours added.
        call = client._open(request.model, request.request_id, build_inputs(request) + lora)
        out: list[int] = []
        async for response in call:
            if response.error_message:
                raise RuntimeError(response.error_message)
            result = InferResult(response.infer_response)
            if (new := result.as_numpy("output_ids")) is not None:  # the empty final has none
                length = int(np.asarray(result.as_numpy("sequence_length")).reshape(-1)[0])
                out += new.reshape(-1)[:length].tolist()
            if response.infer_response.parameters["triton_final_response"].bool_param:
                break
        call.cancel()
        return str(tokenizer.decode(out, skip_special_tokens=True))

    answers = []
    for i, prompt in enumerate(UNSEEN_PROMPTS):
        ids = chat(tokenizer, prompt)
        pair = await asyncio.gather(one(ids, first if i == 0 else later), one(ids, []))
        answers.append((pair[0], pair[1]))
    await client.close()
    return answers


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--adapter", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--threads", type=int, default=idle_cores())
    parser.add_argument("--engine", action="store_true", help="also through the cpu engine")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    base = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, args.adapter)
    model.eval()
    ok = True
    answers = []
    for prompt in UNSEEN_PROMPTS:
        tuned = answer(model, tokenizer, prompt, args.max_tokens)
        with model.disable_adapter():
            plain = answer(model, tokenizer, prompt, args.max_tokens)
        good = tuned.startswith(OPENER) and not plain.startswith(OPENER)
        ok &= good
        answers.append((tuned, plain))
        print(f"## {prompt}  [{'ok' if good else 'FAILED'}]")
        print(f"  adapter: {tuned!r}\n  base:    {plain!r}")
    print(f"every adapter answer opens with {OPENER!r} and no base answer does: {ok}")
    if args.engine:
        with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as stack:
            url = start_cpu_engine(stack, Path(folder), 16).grpc_url
            served = asyncio.run(engine_answers(url, tokenizer, args.adapter, args.max_tokens))
        for prompt, got, want in zip(UNSEEN_PROMPTS, served, answers, strict=True):
            if got != want:
                ok = False
                print(f"## {prompt}: the engine differs from peft\n  engine: {got!r}")
        print(f"the cpu engine's greedy answers (adapter and base) equal peft's: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
