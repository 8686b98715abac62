"""The memory a long prompt's log-probs take on the cpu engine (engine/prompt_logprobs.py): scored
a chunk of positions at a time, the prefill's peak grows by about two chunks of float32 logits,
not by the prompt's [input_len, vocab] (2,048 × 49152 × 4 bytes = 384 MiB, twice that for the
twin rows the prefill runs).

Measured in a process of its own, whose peak resident memory (ru_maxrss) is this request's: the
same 2,048-token prompt is prefilled first without scores (max_tokens 0, the same forward pass),
then with its log-probs and top 5; the second may raise the peak by a quarter of one prompt ×
vocab at most."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROMPT_TOKENS = 2048
SCRIPT = """
import json, resource, sys, threading
from pathlib import Path
from tritonbox_common.tokenization import load_tokenizer
from tritonbox_triton.engine.attention import load_model
from tritonbox_triton.engine.dtype import engine_dtype
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.words import text_decoder


class Sink:
    def __init__(self):
        self.done, self.error, self.prompt = threading.Event(), None, None
    def is_cancelled(self):
        return False
    def on_prompt(self, scores):
        self.prompt = scores
    def on_tokens(self, tokens, logprobs, finish, top=()):
        if finish is not None:
            self.done.set()
    def on_error(self, message):
        self.error = message
        self.done.set()
    def on_cancelled(self):
        self.done.set()

model_dir, length = sys.argv[1], int(sys.argv[2])
model = load_model(model_dir, engine_dtype("auto"))
decode = text_decoder(load_tokenizer(Path(model_dir)))
engine = InflightBatcher(model, decode, EngineLimits(length, 16, 4 * length),
                         max_batch_size=2)
engine.start()
prompt = [(7 * i) % 4000 + 100 for i in range(length)]

def peak_after(**scores):
    sink = Sink()
    engine.submit(EngineRequest(prompt, SamplingParams(0, 2, 2, **scores), sink, [], []))
    assert sink.done.wait(300)
    assert sink.error is None, sink.error
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, sink

plain, _ = peak_after()
scored, sink = peak_after(return_prompt_log_probs=True, num_top_logprobs=5)
engine.stop()
shape = list(sink.prompt.tensors["prompt_top_log_probs"].shape)
print(json.dumps({"plain": plain, "scored": scored, "vocab": model.config.vocab_size,
                  "top_shape": shape}))
"""


def test_a_long_prompt_s_log_probs_raise_the_peak_by_chunks_not_by_the_prompt(
    tokenizer_dir: Path,
) -> None:
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tokenizer_dir), str(PROMPT_TOKENS)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["top_shape"] == [1, PROMPT_TOKENS - 1, 5]
    whole = PROMPT_TOKENS * measured["vocab"] * 4  # one [input_len, vocab] float32 tensor
    growth = measured["scored"] - measured["plain"]
    print(f"peak {measured['plain'] >> 20} -> {measured['scored'] >> 20} MiB")
    assert growth < whole / 4, f"peak grew {growth >> 20} MiB; the prompt's logits: {whole >> 20}"
