"""Check a trained demo adapter with transformers + peft, outside TritonBox (docs/adapters.md).

Greedy answers, through the model's chat template, to prompts the adapter never saw in training
(`UNSEEN_PROMPTS`), with the adapter and with the bare base side by side. Exits 1 unless every
adapter answer opens with "Ahoy, matey!" and no base answer does. Usage (from the repo root):

    scripts/train_demo_adapter --check-only [--adapter .cache/adapters/demo]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))
from scripts.demo_adapter.data import OPENER, UNSEEN_PROMPTS  # noqa: E402
from scripts.demo_adapter.train import DEFAULT_MODEL, DEFAULT_OUTPUT, idle_cores  # noqa: E402

sys.path.remove(str(REPO))


def answer(model: PeftModel, tokenizer: PreTrainedTokenizerBase, prompt: str, tokens: int) -> str:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(str(text), add_special_tokens=False, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(input_ids=ids, max_new_tokens=tokens, do_sample=False)
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--adapter", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--threads", type=int, default=idle_cores())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    base = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, args.adapter)
    model.eval()
    ok = True
    for prompt in UNSEEN_PROMPTS:
        tuned = answer(model, tokenizer, prompt, args.max_tokens)
        with model.disable_adapter():
            plain = answer(model, tokenizer, prompt, args.max_tokens)
        good = tuned.startswith(OPENER) and not plain.startswith(OPENER)
        ok &= good
        print(f"## {prompt}  [{'ok' if good else 'FAILED'}]")
        print(f"  adapter: {tuned!r}\n  base:    {plain!r}")
    print(f"every adapter answer opens with {OPENER!r} and no base answer does: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
