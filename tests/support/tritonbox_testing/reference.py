"""What the cpu engine must reproduce: transformers' `generate()` on the checkpoint as the engine
loads it (its dtype on this machine, its attention with keys padded to a block of columns, as a
decode batch pads them; tritonbox_triton.engine.attention).

The engine never multiplies a lone row: a single sequence decodes as two identical rows, because
PyTorch's one-row kernel rounds differently from the kernel it uses for two or more (kv_batch.py).
The reference therefore generates two copies of the prompt and reads the first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tritonbox_triton.engine.attention import load_model
from tritonbox_triton.engine.dtype import engine_dtype


def engine_model(model_dir: Path | str) -> Any:
    """The checkpoint as the served engine runs it here (CPU_DTYPE=auto)."""
    return load_model(model_dir, engine_dtype("auto"))


def greedy_generate(
    model: Any, prompt: list[int], max_tokens: int, **kwargs: Any
) -> tuple[list[int], torch.Tensor]:
    """Greedy generate(): the new ids (eos included when it came) and the log-softmax of the
    model's logits at each of them, [tokens, vocab] (no penalty applied)."""
    ids = torch.tensor([prompt, prompt])
    with torch.inference_mode():
        output = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
            output_logits=True, return_dict_in_generate=True, **kwargs,
        )  # fmt: skip
    new = [int(token) for token in output.sequences[0, len(prompt) :]]
    logits = torch.stack([step[0] for step in output.logits]).float()
    eos = {int(e) for e in torch.tensor(model.generation_config.eos_token_id).reshape(-1)}
    if any(token in eos for token in new):  # generate() pads a finished row: cut after eos
        end = next(i for i, token in enumerate(new) if token in eos) + 1
        new, logits = new[:end], logits[:end]
    return new, torch.log_softmax(logits, dim=-1)


def greedy_ids(
    model: Any, prompt: list[int], max_tokens: int, eos: int, **kwargs: Any
) -> list[int]:
    """Greedy generate()'s new ids, through the first `eos` when one came: the cpu engine sends
    the end token that ended an answer too (engine/responses.py, `Responses.advance`)."""
    ids, _ = greedy_generate(model, prompt, max_tokens, **kwargs)
    return _through(ids, eos)


def _through(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    """One user turn through the tokenizer's chat template, ready for the answer: its ids."""
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(rendered).input_ids)


# In bfloat16 two tokens this close are decided by rounding: the engine's products and AMX's
# kernels in generate() sum in different orders (measured on a Sapphire Rapids: 0.0008 nats).
TIE_NATS = 0.01


def assert_greedy_as_generate(
    model: Any, prompt: list[int], got: list[int], max_tokens: int, eos: int
) -> None:
    """`got` is greedy generate()'s answer (`greedy_ids`), or parts from it only at a near tie:
    where generate()'s best two were within `TIE_NATS` and `got` took the other one."""
    ids, logprobs = greedy_generate(model, prompt, max_tokens)
    expected = _through(ids, eos)
    at = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
    if at is None:
        assert got == expected
        return
    best = torch.topk(logprobs[at], 2)
    gap = float(best.values[0] - best.values[1])
    assert got[at] == int(best.indices[1]) and gap < TIE_NATS, (
        f"token {at}: {got[at]} where generate() chose {expected[at]} by {gap:.4f} nats"
    )
