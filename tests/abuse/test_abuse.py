"""The abuse suite: while four interactive users stream chat answers, an attacker holding keys
sends every hostile case of tritonbox_testing.abuse.cases from a process of its own, each after
a quiet block of the same length. Every hostile request is refused with a 4xx naming the field
or the limit (429 with Retry-After where waiting helps), the interactive answers all complete
and are the answers they were at first, their time to first token under attack stays near the
quiet blocks', and the api's and the engine's resident memory stay bounded. The figures of a
longer run: docs/abuse.md (`scripts/benchmark abuse`)."""

from __future__ import annotations

import pytest
from tritonbox_testing.abuse import report, scenario
from tritonbox_testing.abuse.cases import ASSERTED
from tritonbox_testing.abuse.memory import MIB
from tritonbox_testing.hardware import NATIVE_BF16

from .conftest import UnderAttack

pytestmark = pytest.mark.server

# Each case sent for this long, after as long with no attack: about ten interactive answers in
# each block, a hundred and more in each phase (the suite takes under a minute). A float32
# engine (a CPU without native bfloat16) answers at about half the rate: on two AVX2 cores the
# phases held 36 and 28 answers in 1 s blocks, so there the blocks are twice as long.
BLOCK_S = 1.0 if NATIVE_BF16 else 2.0
# Fewer answers than this in a phase and its median says little: the machine was too busy to
# judge (it is a failure, not a pass).
MIN_ANSWERS = 30
TTFT_RATIO_MAX = 1.5  # the attacked blocks' p50 time to first token against the quiet ones'
# Resident memory. The api at rest is about 450 MiB (FastAPI, the tokenizer, SQLAlchemy,
# numpy); a refused request should leave nothing behind and cost little while it lasts: the
# largest are a 1 MiB body (MAX_BODY_BYTES) parsed into objects and a 200,000-character prompt
# tokenized. 128 MiB of growth is room for that and the allocator's arenas, far below what an
# adapter read whole (ADAPTER_MAX_BYTES, 1 GiB) or a body read without its limit would take.
API_RSS_MAX = 1024 * MIB
API_GROWTH_MAX = 128 * MIB
# The engine's process group (tritonserver and three Python-backend stubs, each with torch; the
# default model in float32; beside the cpu engine's stub, the fork server and the two workers
# that try guides, engine/guide_process.py: about 0.7 GiB counted, most of it pages they share)
# is about 2.5 GiB on an AVX2 machine and 2.9-3.0 GiB at rest on an Intel Xeon with AVX-512
# and no bf16 (2026-12-03; the engine's stub 1.4 GiB of it; the code of 3646047 the same: why
# that CPU costs more was not traced). The heaviest request let through is `echo` with
# log-probs of a prompt at the stack's ECHO_MAX_PROMPT_TOKENS (384): the prefill's activations
# and a chunk of logits at a time. The whole prompt's float32 logits and their log-softmax would
# be 384 positions x 49,152 x 4 bytes x 2, twice over for the prefill's twin row: ~300 MiB, over
# the growth bound. A slow guide's trial process is killed at its time limit
# (engine/guide_pool.py).
ENGINE_RSS_MAX = 3584 * MIB
ENGINE_GROWTH_MAX = 256 * MIB


def test_hostile_requests_are_refused_by_name_while_the_others_are_served(
    under_attack: UnderAttack,
) -> None:
    result = scenario.run(
        under_attack.target, under_attack.processes, block_s=BLOCK_S, cases=ASSERTED
    )
    print("\n".join(report.lines(result)))  # the figures, in the log
    problems = {
        w.case: c.problems(w.answers) for w, c in zip(result.windows, ASSERTED, strict=True)
    }
    assert not {case: found for case, found in problems.items() if found}
    assert [w.case for w in result.windows] == [c.name for c in ASSERTED]

    wrong = result.wrong()
    assert not wrong, f"{len(wrong)} of {len(result.samples)} interactive answers: {wrong[:3]}"
    quiet, attacked = result.quiet_samples(), result.attacked_samples()
    assert len(quiet) >= MIN_ANSWERS and len(attacked) >= MIN_ANSWERS, (len(quiet), len(attacked))
    quiet_p50, attacked_p50 = result.ttft_p50(quiet), result.ttft_p50(attacked)
    assert attacked_p50 <= TTFT_RATIO_MAX * quiet_p50, (quiet_p50, attacked_p50)

    bounds = {"api": (API_RSS_MAX, API_GROWTH_MAX), "engine": (ENGINE_RSS_MAX, ENGINE_GROWTH_MAX)}
    for name, (most, growth) in bounds.items():
        before, peak = result.peak(name, [result.before]), result.peak(name, result.attack)
        assert before > 0 and peak <= most, (name, before / MIB, peak / MIB)
        assert peak - before <= growth, (name, before / MIB, peak / MIB)
