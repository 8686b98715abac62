"""The abuse suite's figures: every hostile case of tritonbox_testing.abuse.cases sent for a
while against the cpu engine and the default model, beside four interactive streams, and what
each case did to them and to the servers' memory. Writes docs/abuse.md.

The same harness as tests/abuse (which asserts; this measures longer and writes the table):
tritonserver with the cpu engine at its default settings, an api with the suite's named keys
and limits (tritonbox_testing.abuse.stack) and its own SQLite file, the hostile requests from a
process of their own at a lower priority. Usage (from the repo root):

    scripts/benchmark abuse [--block 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from scripts.benchmarks.servers import start_api, start_cpu_engine
from tritonbox_testing.abuse import adapters, report, scenario, stack
from tritonbox_testing.abuse.cases import SENDS_PER_S
from tritonbox_testing.abuse.memory import MIB, group_of
from tritonbox_testing.abuse.requests import Target, auth
from tritonbox_testing.abuse.streams import MAX_TOKENS, PROMPTS

from tritonbox_api.settings import ApiSettings

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "abuse.md"


def _mib(value: int) -> str:
    return f"{value / MIB:,.0f}"


def _phase(result: scenario.Result, rows: list[report.Row], label: str) -> str:
    quiet = result.quiet_samples()
    spans = [w.attack for w, r in zip(result.windows, rows, strict=True) if r.asserted]
    attacked = result.attacked_samples(spans)
    ratio = result.ttft_p50(attacked) / result.ttft_p50(quiet)
    return (
        f"{label}: TTFT p50 **{result.ttft_p50(quiet) * 1000:.0f} ms** quiet ({len(quiet)} "
        f"answers), **{result.ttft_p50(attacked) * 1000:.0f} ms** under attack ({len(attacked)} "
        f"answers): **{ratio:.2f}×**"
    )


def page(result: scenario.Result, args: argparse.Namespace, setup: dict[str, str]) -> str:
    quiet = result.ttft_p50(result.quiet_samples())
    rows = [report.row(result, window) for window in result.windows]
    asserted = [w for w, r in zip(result.windows, rows, strict=True) if r.asserted]
    wrong = [
        s for s in result.wrong() if any(a <= s.start < b for a, b in (w.attack for w in asserted))
    ]
    problems = {r.case: r.problems for r in rows if r.asserted and r.problems}
    before = {n: result.peak(n, [result.before]) for n in ("api", "engine")}
    peak = {n: result.peak(n, [w.attack for w in asserted]) for n in ("api", "engine")}
    out = [
        "# Abuse: hostile requests beside interactive users",
        "",
        f"Produced by `{setup['command']}` on {setup['date']} at {setup['commit']}, measuring for "
        f"{setup['minutes']} min. Every row comes from the same run; `tests/abuse/test_abuse.py` "
        "asserts the same things on a shorter one.",
        "",
        f"- **Machine**: {os.cpu_count()} cores, shared with other work: load average "
        f"{setup['load']}.",
        "- **Servers**: tritonserver with `ENGINE=cpu` and the default model at its default "
        "settings but `GUIDE_COMPILE_TIMEOUT_S="
        f"{stack.GUIDE_COMPILE_TIMEOUT_S:g}`; the api with its own SQLite file, "
        f"`ECHO_MAX_PROMPT_TOKENS={stack.ECHO_MAX_PROMPT_TOKENS}`, `MAX_CONCURRENT_REQUESTS="
        f"{stack.MAX_CONCURRENT_REQUESTS}`, named keys (`tests/support/tritonbox_testing/abuse/"
        f"stack.py`: a key of {stack.SCRIPT_RPM} requests a minute, one of {stack.GREEDY_TPM} "
        "tokens a minute, use keys without limits, a manage key), `ADAPTER_DIRS` a folder of "
        f"hostile adapters, `ADAPTER_HUB_REPOS={stack.HUB_PATTERN}`, `MAX_BATCH_FILE_BYTES="
        f"{stack.MAX_BATCH_FILE_BYTES}`, the other limits at their defaults.",
        f"- **The others**: {len(PROMPTS)} interactive users, each streaming a chat answer of up "
        f"to {MAX_TOKENS} tokens (greedy, a short question) and asking again as soon as it ends. "
        "Time to first token (TTFT) is measured by their client, from sending to the first "
        "token's text. A block counts the answers sent during it, however long they waited; a "
        f"quiet block's first {scenario.SETTLE_FRACTION:.0%} is left out (what the case before "
        "it left running ends there).",
        f"- **The attack**: each case after a quiet block, {args.block:g} s each, one case after "
        f"another; a case's request (or burst) {SENDS_PER_S} times a second unless its row says "
        f"otherwise, from a process of its own at nice {scenario.ATTACKER_NICE} (its own CPU "
        "is not the servers': a real attacker's is on another machine). Quiet and attacked "
        "blocks alternate, so the other work on the machine falls on both alike.",
        "- **Memory**: resident memory (VmRSS) of the api's process and of tritonserver's process "
        "group (the server and its Python-backend stubs, where the engine runs), read every "
        "50 ms: the peak during the case.",
        "",
        _phase(result, rows, "**The asserted cases**") + ". Interactive answers that failed or "
        f"differed from their first answer during them: **{len(wrong)}**. Peak memory before → "
        f"during them: api {_mib(before['api'])} → {_mib(peak['api'])} MiB, engine "
        f"{_mib(before['engine'])} → {_mib(peak['engine'])} MiB. Cases answered otherwise than "
        f"required: **{len(problems)}**"
        + "".join(f"; {case}: {'; '.join(p)}" for case, p in problems.items())
        + ".",
        "",
        "| case | answer | TTFT p50 of the others (× quiet) | memory peak, api / engine (MiB) |",
        "|---|---|---:|---:|",
    ]
    for r in rows:
        answer = r.answer().replace("|", "\\|")
        effect = f"{r.ttft_p50_s * 1000:.0f} ms ({r.ttft_p50_s / quiet:.2f}×, {r.samples} answers)"
        if r.refused_others:
            effect += f"; {r.refused_others} of their requests refused"
        case = r.what if r.asserted else f"{r.what} (measured, not asserted)"
        out.append(f"| {case} | {answer} | {effect} | {_mib(r.api_peak)} / {_mib(r.engine_peak)} |")
    out += [
        "",
        "Each refusal names the field or the setting that bounds it (the message shown is the "
        "first refusal's; `n × status` when a case was sent several times). Answers of 200 are "
        "the part of a case within its limits: the first requests of the flood, and `echo`, which "
        "is allowed and whose cost the row shows.",
        "",
    ]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block", type=float, default=3.0, help="seconds of each block")
    args = parser.parse_args()
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    with contextlib.ExitStack() as stack_, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        triton = start_cpu_engine(
            stack_, folder / "triton", batch_size=16, **stack.triton_settings()
        )
        max_bytes = int(ApiSettings.model_fields["adapter_max_bytes"].default)
        hostile = adapters.make(folder / "adapters", max_bytes)
        env = {k.upper(): v for k, v in stack.api_settings(hostile.root).items()}
        url, pid = start_api(stack_, folder / "api", triton.grpc_url, env)
        limits = httpx.get(f"{url}/v1/limits", headers=auth("people"), timeout=30).json()
        target = Target(url, limits["model"], limits["max_input_tokens"], hostile)
        engine = group_of(f"--grpc-port={triton.triton_grpc_port}")
        measuring = time.monotonic()
        result = scenario.run(target, {"api": pid, "engine": engine}, block_s=args.block)
        minutes = (time.monotonic() - measuring) / 60
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                            capture_output=True).stdout.strip()  # fmt: skip
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                             text=True, capture_output=True).stdout.splitlines()  # fmt: skip
    if changed:  # a shared working tree: say what the run had that the commit has not
        commit += " with uncommitted changes to " + ", ".join(f"`{line[3:]}`" for line in changed)
    setup = {
        "command": " ".join(sys.argv),  # as __main__ sets it: the command line
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit,
        "minutes": f"{minutes:.1f}",
        "load": f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after",
    }
    print("\n".join(report.lines(result)))
    PAGE.write_text(page(result, args, setup))
    print(f"wrote {PAGE} in {(time.monotonic() - started) / 60:.1f} min")
    return 0
