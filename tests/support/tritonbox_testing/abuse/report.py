"""Each case's row of figures (the test prints them, `scripts/benchmark abuse` writes them to
docs/abuse.md): what it was answered, the interactive streams' time to first token while it
was sent against the quiet value, and the servers' memory meanwhile."""

from __future__ import annotations

from dataclasses import dataclass

from tritonbox_testing.abuse.cases import CASES
from tritonbox_testing.abuse.memory import MIB
from tritonbox_testing.abuse.scenario import Result, Window

SHOWN_CHARS = 110


@dataclass(frozen=True)
class Row:
    case: str
    what: str
    answers: int
    statuses: dict[int, int]  # status -> how many
    message: str  # the first refusal's message
    ttft_p50_s: float  # the interactive streams', requests sent during the case
    samples: int
    api_peak: int  # bytes
    engine_peak: int
    asserted: bool  # by the test (Case.asserted)
    problems: list[str]  # how its answers differ from what is required
    refused_others: int  # interactive requests sent during it that failed (429: slots taken)

    def answer(self) -> str:
        counts = ", ".join(f"{n} × {s}" if n > 1 else str(s) for s, n in self.statuses.items())
        text = self.message[:SHOWN_CHARS] + ("…" if len(self.message) > SHOWN_CHARS else "")
        return f"{counts}: {text}" if text else counts


def row(result: Result, window: Window) -> Row:
    case = next(c for c in CASES if c.name == window.case)
    statuses: dict[int, int] = {}
    for a in window.answers:
        statuses[a.status] = statuses.get(a.status, 0) + 1
    refused = [a.message for a in window.answers if a.status >= 400]
    span = [window.attack]
    return Row(
        case=case.name,
        what=case.what,
        answers=len(window.answers),
        statuses=dict(sorted(statuses.items())),
        message=refused[0] if refused else "",
        ttft_p50_s=result.ttft_p50(result.attacked_samples(span)),
        samples=len(result.attacked_samples(span)),
        api_peak=result.peak("api", span),
        engine_peak=result.peak("engine", span),
        asserted=case.asserted,
        problems=case.problems(window.answers),
        refused_others=sum(
            1 for s in result.samples if s.error and window.attack[0] <= s.start < window.attack[1]
        ),
    )


def lines(result: Result) -> list[str]:
    """A plain summary, one line a case and one for the whole (the test's log)."""
    quiet = result.ttft_p50(result.quiet_samples())
    out = []
    for r in (row(result, w) for w in result.windows):
        out.append(f"{r.case:18} {r.answer()[:70]:72} ttft p50 {r.ttft_p50_s * 1000:4.0f} ms "
                   f"({r.samples:2}) api {r.api_peak / MIB:5.0f} MiB engine "
                   f"{r.engine_peak / MIB:5.0f} MiB")  # fmt: skip
    attacked = result.ttft_p50(result.attacked_samples())
    out.append(
        f"quiet: ttft p50 {quiet * 1000:.0f} ms ({len(result.quiet_samples())} answers); "
        f"attacked: {attacked * 1000:.0f} ms ({len(result.attacked_samples())} answers), "
        f"{attacked / quiet:.2f}x; peaks before / attacked: api "
        f"{result.peak('api', [result.before]) / MIB:.0f} / "
        f"{result.peak('api', result.attack) / MIB:.0f} MiB, engine "
        f"{result.peak('engine', [result.before]) / MIB:.0f} / "
        f"{result.peak('engine', result.attack) / MIB:.0f} MiB"
    )
    return out
