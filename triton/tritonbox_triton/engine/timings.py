"""The engine's waits and thresholds, each with the case it is for, in one place.

The defaults are what the closed-loop benchmark was tuned and measured with (`scripts/benchmark
vllm-cpu`; docs/cpu-engine.md, "Knobs"; the rounds behind each number: cpu-engine-history.md).
`InflightBatcher` takes one `EngineTimings`; the tests pass slowed copies (`dataclasses.replace`)
so that a loaded machine's late sleep cannot decide which requests share a prefill.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineTimings:
    """Admission (admission.py), token pairs (responses.py), cancellation (cancellation.py),
    chunked prefill and the prefix cache (filling.py, prefix_cache.py) and idle trimming
    (heap.py). Seconds unless the name says otherwise."""

    # --- Bursts: clients that send together. Requests reach the engine one at a time even then
    # (each passes the api and the preprocessing model first): 16 sent straight to Triton arrive
    # over 10-35 ms, the first ~7 ms ahead. An idle engine that prefilled what had arrived took
    # two passes of the weights where one would do, and the rest waited for both.

    # A burst is over once no request came for this long (the gap between a burst's requests
    # is a few ms; a single stream's next request is far later).
    quiet_s: float = 0.008
    # The longest a burst is waited for after its first request; also how close in time two
    # arrivals must be to count as a burst, and requests ending to count as "ended together".
    window_s: float = 0.04
    # Bursts are waited for only while one was seen this recently: single streams never wait.
    memory_s: float = 30.0

    # --- Waves: a closed loop (a chat front end, a load generator) sends its next requests as
    # its streams end. Through the api a wave of 16 reached the engine 50-75 ms after its
    # predecessor ended, sometimes its first ~33 ms ahead of the rest (the first prediction row
    # is written alone, the others together behind it), which an 8 ms gap split in two passes.

    # A request this soon after the batch emptied (with two or more ending together) opens
    # the wave expected back, while waves have been seen to come back (admission.py).
    wave_return_s: float = 0.1
    # The quiet gap that ends a returning wave's wait (its requests come spread out).
    wave_quiet_s: float = 0.04
    # The longest a returning wave is waited for, after its first request.
    wave_window_s: float = 0.08

    # --- Two passes. A pass costs a fixed part and a part per prompt (~30 ms and ~9 ms a
    # 39-token prompt on the AMD EPYC), so a group of N gets its least mean time to first token
    # with a first pass of N // 2 + 1 and the rest right after. Below this count the second
    # pass's fixed cost outweighs the gain: the group is waited for and prefilled whole.
    split_from: int = 8

    # --- Responses. Each costs ~0.8 ms of CPU on its way (the sending thread, tritonserver, the
    # api, the client), taken from the engine's two cores: at 16 streams a fifth of them. From
    # this many running sequences on, a token that neither starts nor ends its sequence is held
    # and sent with the next one; below it every token leaves as it is made.
    pairs_from: int = 8

    # --- Cancellation. Whether a client left is a round trip to tritonserver (milliseconds on a
    # loaded CPU, once per request), so it is asked at most this often; a `stop` acts at once.
    cancel_check_s: float = 0.1
    # A `stop` for an id not seen yet is kept this long: it may overtake its request.
    early_stop_ttl_s: float = 60.0

    # --- Chunked prefill (filling.py). While streams run, a long prompt is prefilled a chunk
    # a step, sized from the observed cost of a step and of a chunk's token (about 0.7 of a
    # plain step's time), at most this many tokens: a larger chunk's activations grow with it,
    # and past a few hundred tokens a chunk gains little. 0: never chunked (a long prompt is one
    # pass, the streams wait for it).
    prefill_chunk_tokens: int = 512
    # A prompt no longer than prefill_chunk_tokens whose prefill costs at most this (as the
    # engine has observed: chunk_budget.py) is prefilled whole as it arrives, even while
    # streams run: they wait for it once, as every stream waits for every prompt on vLLM's and
    # TensorRT-LLM's defaults, and its user gets the first token one pass away rather than a
    # chunk a step. On open-loop mixed traffic (prompts
    # of 20-500 tokens beside ~7 streams) chunks of every prompt made the time to first token p90
    # ~4x vLLM's and left slots filling at saturation. A longer prompt comes in chunks, so no
    # stream waits longer than this for one prompt. 0: every prompt longer than a chunk in chunks.
    whole_prefill_s: float = 0.5
    # --- Prefix cache (prefix_cache.py): the bytes of prompts' keys and values kept for the
    # prompts that start the same way. ~23 KB a token for SmolLM2-135M: 128 MiB is ~5,800
    # tokens, a few system prompts and conversations. 0: off.
    prefix_cache_bytes: int = 128 << 20

    # --- Memory. Idle this long, the engine gives what its work freed back to the system, once
    # per idle spell: later than a request's usual gap, so that none waits for the trim.
    idle_trim_s: float = 1.0


DEFAULT_TIMINGS = EngineTimings()
