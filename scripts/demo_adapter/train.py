"""Train the demo LoRA adapter for the default model on CPU (docs/adapters.md).

From the chat examples in scripts/demo_adapter/data.jsonl (every answer a pirate's, opening with
"Ahoy, matey!"), trains a rank-16 LoRA on SmolLM2-135M-Instruct's projections with peft, seeded,
in a few minutes on two cores, and writes a standard PEFT folder (adapter_config.json +
adapter_model.safetensors) that `POST /v1/adapters` or LORA_ADAPTERS accepts. Usage (from the
repository root):

    scripts/train_demo_adapter [--output .cache/adapters/demo]

then check it on prompts it never saw: `scripts/demo_adapter/check.py`.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))  # the sibling module as `scripts.…`, as mypy names it
from scripts.demo_adapter.data import DATA_FILE, load  # noqa: E402

sys.path.remove(str(REPO))

DEFAULT_MODEL = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
DEFAULT_OUTPUT = REPO / ".cache" / "adapters" / "demo"
# What adapter_config.json names as the base: the default model's Hugging Face id (its local
# folder's absolute path would mean nothing on another machine).
BASE_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
IGNORE = -100  # cross-entropy's ignore index: prompt tokens are not learned


@dataclass(frozen=True)
class Example:
    ids: list[int]
    answer_start: int  # index of the first answer token: the loss covers ids[answer_start:]


def tokenize(
    tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, list[dict[str, str]]]]
) -> list[Example]:
    """Each row rendered by the model's chat template exactly as the api renders a chat (no
    special tokens added on top), learning only the assistant's turn and its end token."""
    examples = []
    for row in rows:
        prompt = tokenizer.apply_chat_template(
            row["messages"][:1], tokenize=False, add_generation_prompt=True
        )
        full = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        prompt_ids = tokenizer(str(prompt), add_special_tokens=False).input_ids
        ids = tokenizer(str(full), add_special_tokens=False).input_ids
        if ids[: len(prompt_ids)] != prompt_ids:
            raise ValueError(f"the chat template does not extend the prompt: {row}")
        examples.append(Example(ids, len(prompt_ids)))
    return examples


def collate(batch: list[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask, and the next-token targets (IGNORE outside answers)."""
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    targets = torch.full((len(batch), width), IGNORE)
    for row, example in enumerate(batch):
        ids[row, : len(example.ids)] = torch.tensor(example.ids)
        mask[row, : len(example.ids)] = 1
        # Position t predicts token t+1: the targets are the answer's tokens shifted left by one.
        answer = torch.tensor(example.ids[example.answer_start :])
        targets[row, example.answer_start - 1 : len(example.ids) - 1] = answer
    return ids, mask, targets


def answer_loss(
    model: PeftModel, ids: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy over answer tokens. The vocabulary projection (a fifth of the model's
    work per token) runs only where there is a target, not over the system prompt and question."""
    causal_lm: Any = model.get_base_model()  # a LlamaForCausalLM, typed as a bare Module
    hidden = causal_lm.model(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = targets != IGNORE
    logits = causal_lm.lm_head(hidden[keep])
    return torch.nn.functional.cross_entropy(logits, targets[keep])


def train(args: argparse.Namespace) -> Path:
    """Train and save the adapter into args.output; returns the folder."""
    started = time.perf_counter()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    if args.model_dir == DEFAULT_MODEL:
        from tritonbox_triton.prepare_model import prepare_default_model

        prepare_default_model(args.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    base = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=args.rank,
        lora_alpha=2 * args.rank,
        lora_dropout=0.0,
        bias="none",
        target_modules=list(args.target_modules),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config)
    examples = tokenize(tokenizer, load(args.data)[: args.limit])
    order = random.Random(args.seed)
    batches_per_epoch = -(-len(examples) // args.batch_size)
    steps = args.steps or args.epochs * batches_per_epoch
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0
    )
    warmup = max(1, steps // 10)  # linear warm-up, then linear decay to zero

    def ramp(step: int) -> float:
        return min((step + 1) / warmup, max(0.0, (steps - step) / max(1, steps - warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, ramp)
    print(
        f"{len(examples)} examples, {steps} steps of {args.batch_size}, rank {args.rank} on "
        f"{', '.join(args.target_modules)}, {args.threads} torch threads",
        file=sys.stderr,
    )
    model.train()
    queue: list[Example] = []
    progress = tqdm(range(steps), desc="training", unit="step")
    for _ in progress:
        if len(queue) < args.batch_size:  # a fresh shuffled pass once this one runs out
            fresh = examples[:]
            order.shuffle(fresh)
            queue += fresh
        batch, queue = queue[: args.batch_size], queue[args.batch_size :]
        loss = answer_loss(model, *collate(batch, int(tokenizer.pad_token_id or 0)))
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        progress.set_postfix(loss=f"{loss.item():.3f}")
    model.peft_config["default"].base_model_name_or_path = args.base_model_id
    args.output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.output, save_embedding_layers=False)
    print(f"wrote {args.output} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return Path(args.output)


def idle_cores() -> int:
    """Cores not busy right now (by the 1-minute load average), 1 to 4. torch's threads spin
    while they wait for each other: on a shared machine, more threads than idle cores made a
    step 10x slower here, and beyond four a 135M model gains little."""
    return max(1, min(4, round((os.cpu_count() or 1) - os.getloadavg()[0])))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--base-model-id", default=BASE_MODEL_ID, help="adapter_config's base model")
    p.add_argument("--data", type=Path, default=DATA_FILE)
    p.add_argument("--limit", type=int, help="train on the first N examples only")
    p.add_argument("--epochs", type=int, default=2)  # what the check in docs/adapters.md used
    p.add_argument("--steps", type=int, help="optimizer steps (default: the epochs' worth)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--target-modules", nargs="+", default=ATTENTION)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=idle_cores(), help="default: idle cores now")
    return p


if __name__ == "__main__":
    train(parser().parse_args())
