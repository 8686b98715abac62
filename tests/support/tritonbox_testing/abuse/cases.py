"""The hostile cases, and what each must be answered: a 4xx (429 with Retry-After where waiting
helps) whose message names the field or the limit, small, and naming no server folder.

A case may be served in part where part of it is within a limit (the first requests of a flood,
a burst's requests that find free slots): `served` bounds how many."""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx
from tritonbox_testing.abuse import requests as r
from tritonbox_testing.abuse import stack
from tritonbox_testing.abuse.adapters import HostileAdapters
from tritonbox_testing.abuse.requests import Send

from tritonbox_api.protocol.generation import MAX_MESSAGES
from tritonbox_api.protocol.openai import MAX_CHOICES
from tritonbox_common.guided import MAX_GUIDE_CHARS, MAX_SCHEMA_NESTING
from tritonbox_common.parameters import MAX_PROMPT_CHARS, MAX_WORDS

# An error answer says what is wrong in a sentence: it never reflects a large input back (a
# 1 MiB body answered by 1 MiB more is an amplifier).
ERROR_BODY_MAX = 4096
MIB = 1024 * 1024
# A case's pace: its request (or its burst) this many times a second. A refusal costs the api
# a millisecond or two of its event loop, so this is a fraction of what one connection sending
# back to back reaches (several hundred a second: the `full-speed` case, which measures that).
SENDS_PER_S = 10
_SOURCE = re.compile(r"source '.*?' is not")


@dataclass(frozen=True)
class Answer:
    status: int
    message: str
    retry_after: str | None
    size: int  # the body's bytes
    leaked: bool  # names a server folder the request did not


def answer_of(response: httpx.Response, folders: tuple[str, ...]) -> Answer:
    try:
        error = response.json().get("error") or {}
        message = str(error.get("message", "")) if isinstance(error, dict) else ""
    except ValueError:
        message = ""
    try:
        sent = response.request.content.decode(errors="replace")
    except httpx.RequestNotRead:  # a body sent in chunks, without a copy kept
        sent = ""
    asked = sent + str(response.request.url)
    leaked = any(f in response.text and f not in asked for f in folders)
    retry = response.headers.get("retry-after")
    return Answer(response.status_code, message, retry, len(response.content), leaked)


@dataclass(frozen=True)
class Case:
    name: str
    what: str  # the case as docs/abuse.md's table says it
    send: Send
    status: int  # what a refusal is; 200: a heavy request within the limits, to be served
    names: tuple[str, ...]  # what every refusal's message holds: the field, the limit
    retry_after: bool | None = None  # a 429 must carry Retry-After (True) or must not (False)
    served: int = 0  # how many 2xx answers are within a limit, at most
    one_text: bool = False  # every refusal says the same but for the source it repeats
    sends_per_s: float = SENDS_PER_S  # 0: back to back, as fast as the connection goes
    asserted: bool = True  # False: measured by the benchmark only (see the last cases)

    def problems(self, answers: list[Answer]) -> list[str]:
        """What is wrong with the answers to this case (nothing: [])."""
        if self.status == 200:  # heavy but within every limit: served, its cost measured
            return sorted({f"answered {a.status}: {a.message[:200]}" for a in answers
                           if a.status != 200})  # fmt: skip
        found = []
        served = [a for a in answers if 200 <= a.status < 300]
        if len(served) > self.served:
            found.append(f"{len(served)} served, at most {self.served} may be")
        refused = [a for a in answers if not 200 <= a.status < 300]
        if not refused:
            found.append("nothing refused")
        for a in refused:
            if a.status != self.status:
                found.append(f"answered {a.status}, not {self.status}: {a.message[:200]}")
            missing = [n for n in self.names if n not in a.message]
            if missing:
                found.append(f"the message {a.message[:300]!r} does not name {missing}")
            expected = self.retry_after
            if a.status == 429 and expected is not None and (a.retry_after is not None) != expected:
                found.append(f"429 with Retry-After {a.retry_after}")
            if a.size > ERROR_BODY_MAX:
                found.append(f"an error of {a.size} bytes (at most {ERROR_BODY_MAX})")
            if a.leaked:
                found.append(f"a server folder in the answer: {a.message[:300]!r}")
        texts = {_SOURCE.sub("source … is not", a.message) for a in refused}
        if self.one_text and len(texts) > 1:
            found.append(f"{len(texts)} different answers tell sources apart: {sorted(texts)}")
        return sorted(set(found))


def _outside(a: HostileAdapters) -> list[str]:
    """Every road out of ADAPTER_DIRS, and a Hub repo ADAPTER_HUB_REPOS does not allow."""
    return [
        "../outside/secret",  # relative to the root
        f"{a.root}/../outside/secret",
        str(a.outside),
        "/etc",
        "/proc/self/cwd",
        "~root",
        "escape",  # a link in the root to a folder out of it
        "half",  # a folder in the root whose weights link out of it
        "no-such-adapter",
        "a\0b",
        "meta-llama/Llama-3.1-8B",
    ]


SOURCE_REFUSED = "is not an adapter this server may load"
SLOW_STRINGS = 16
SLOTS = "MAX_CONCURRENT_REQUESTS"
CASES = [
    Case("n-over-limit", f"chat `n` = 10,000 (the limit: {MAX_CHOICES})",
         r.chat(n=10_000), 400, ("n:", str(MAX_CHOICES))),
    Case("n-past-slots", f"chat `n` = {MAX_CHOICES} while a stream holds a slot",
         r.holding_a_slot(r.chat(n=MAX_CHOICES)), 429, (SLOTS, "each choice of `n` takes one"),
         retry_after=True),
    Case("flood", f"a key of {stack.SCRIPT_RPM} requests a minute sends 24 at a time, 6 at "
         "once, twice a second", r.at_once(r.complete("script", max_tokens=2), 24, 6), 429,
         (f"rate limit reached for key script: {stack.SCRIPT_RPM} requests per minute",),
         retry_after=True, served=stack.SCRIPT_RPM + 1, sends_per_s=2),
    Case("too-many-tokens", f"`n` 4 × 400 tokens from a key of {stack.GREEDY_TPM} tokens a minute",
         r.complete("greedy", n=4, max_tokens=400), 429,
         ("request too large for key greedy", f"{stack.GREEDY_TPM} tokens per minute"),
         retry_after=False),
    Case("max-tokens", "`max_tokens` 10⁹", r.chat(max_tokens=10**9), 400,
         ("max_tokens", "MAX_OUTPUT_LEN")),
    Case("prompt-chars", f"a prompt of {MAX_PROMPT_CHARS + 1:,} characters",
         r.complete(prompt="a" * (MAX_PROMPT_CHARS + 1)), 400, ("prompt", str(MAX_PROMPT_CHARS))),
    Case("prompt-tokens", "a prompt of 8 × MAX_INPUT_LEN tokens",
         r.long_prompt(8), 400, ("prompt", "MAX_INPUT_LEN")),
    Case("many-messages", f"a chat of {MAX_MESSAGES + 1} messages",
         r.many_messages(MAX_MESSAGES + 1, "hi"), 400, ("messages", str(MAX_MESSAGES))),
    Case("long-chat", f"a chat of {MAX_MESSAGES} messages of 700 characters",
         r.many_messages(MAX_MESSAGES, "word " * 140), 400, ("messages", "MAX_INPUT_LEN")),
    Case("echo-over", f"`echo` + `logprobs` 5 of a prompt of MAX_INPUT_LEN tokens (the limit: "
         f"{stack.ECHO_MAX_PROMPT_TOKENS})", r.echo_prompt(lambda t: t.max_input_len - 8), 400,
         ("echo", "ECHO_MAX_PROMPT_TOKENS", str(stack.ECHO_MAX_PROMPT_TOKENS))),
    Case("echo-max", "`echo` + `logprobs` 5 of a prompt of ECHO_MAX_PROMPT_TOKENS tokens, nothing "
         "generated (allowed: its cost is measured)",
         r.echo_prompt(lambda t: stack.ECHO_MAX_PROMPT_TOKENS - 8), 200, ()),
    Case("stop-words", f"{MAX_WORDS + 1} stop words", r.chat(stop=["x"] * (MAX_WORDS + 1)), 400,
         ("stop", str(MAX_WORDS))),
    Case("guide-size", f"a `guided_regex` of {MAX_GUIDE_CHARS + 1:,} characters",
         r.chat(guided_regex="a" * (MAX_GUIDE_CHARS + 1)), 400,
         ("guided_regex", str(MAX_GUIDE_CHARS))),
    Case("schema-depth", f"a JSON schema nested {MAX_SCHEMA_NESTING + 6} levels",
         r.chat(guided_json=r.nested_schema(MAX_SCHEMA_NESTING + 6)), 400,
         ("guided_json", f"{MAX_SCHEMA_NESTING} levels")),
    Case("guide-slow", f"a `guided_json` schema of {SLOW_STRINGS} strings with maxLengths of "
         "about 1,000 (26 s of xgrammar's time), a new one each time; GUIDE_COMPILE_TIMEOUT_S "
         f"{stack.GUIDE_COMPILE_TIMEOUT_S:g} s", r.slow_schema(SLOW_STRINGS), 400,
         ("guided_json", f"limit of {stack.GUIDE_COMPILE_TIMEOUT_S:g} s",
          "GUIDE_COMPILE_TIMEOUT_S")),
    Case("deep-json", "a 200 KB body of lists nested 100,000 deep",
         r.raw("/v1/chat/completions", r.deep_json(100_000)), 400, ("body", "nested")),
    Case("body-size", "a 2 MiB body, with and without Content-Length",
         r.both(r.raw("/v1/completions", r.large_json(2 * MIB)),
                r.raw("/v1/completions", r.chunks(2 * MIB))), 413, ("body", "MAX_BODY_BYTES")),
    Case("upload-size", f"batch files of 100 and 300 KB (limit {stack.MAX_BATCH_FILE_BYTES:,})",
         r.both(r.upload(100_000), r.upload(300_000)), 413, ("MAX_BATCH_FILE_BYTES",)),
    Case("adapter-size", "an adapter of 2 GiB (sparse; ADAPTER_MAX_BYTES 1 GiB)",
         r.register(lambda a: ["oversize"]), 400, ("adapter x", "ADAPTER_MAX_BYTES")),
    Case("adapter-header", "malformed safetensors: negative shape, 2⁶² header, not a map",
         r.register(lambda a: ["negative-shape", "header-bomb", "not-a-map"]), 400,
         ("adapter x", "adapter_model.safetensors is corrupt")),
    Case("adapter-base-name", "an adapter named as the base model", r.base_name, 409,
         ("name is the base model's",)),
    Case("adapter-source", "`../`, absolute paths, links out of ADAPTER_DIRS, a Hub repo not "
         "allowed, a NUL", r.register(_outside), 400, (SOURCE_REFUSED, "ADAPTER_DIRS"),
         one_text=True),
    Case("use-key-manages", "a use key registers and deletes an adapter", r.manage_with_use_key,
         403, ("the key intruder lacks the manage role",)),
    Case("wrong-key", "a guessed key", r.wrong_key, 401, ("API key",)),
    Case("page-size", "`GET /v1/predictions?limit=10⁹`", r.page_size, 422, ("limit", "100")),
    # Measured, not asserted (after every other case: they leave the others refused or slowed
    # for their block). A key without a rate limit may take every free slot, and the others get
    # 429 when they come back; an unpaced flood of the cheapest refusal takes the api's event
    # loop. docs/abuse.md has what each does.
    Case("burst-unlimited", "12 completions at once, again and again, from a key without limits",
         r.at_once(r.complete(max_tokens=4), 12, 12), 429, (SLOTS,), retry_after=True,
         served=10**6, asserted=False),
    Case("full-speed", "guessed keys sent back to back from one connection, unpaced",
         r.wrong_key, 401, ("API key",), sends_per_s=0, asserted=False),
]  # fmt: skip
ASSERTED = [case for case in CASES if case.asserted]
