"""scripts/benchmark workers's report: the tables, the targets (met / not met, with the numbers)
and the measurements that explain a missed one (on shared cores, mostly the busy-cores column)."""

from __future__ import annotations

import argparse

from scripts.benchmarks.api_report import Batch
from scripts.benchmarks.workers_report import (
    DATABASES,
    GRPC,
    Config,
    Summary,
    Table,
    cores,
    header,
    summaries,
    table,
)

TARGET_C = 64  # the concurrency the targets are set at
TARGET_API_MS, TARGET_TTFT_MS, TARGET_DB_COST = 150.0, 50.0, 0.05
SATURATED = 0.9  # a row whose machine kept this share of its cores busy had no CPU to spare


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def total_ms(s: Table, c: int, path: str) -> float:
    """CPU per 1 000 output tokens of every process on the path: Triton, api, database, client."""
    return sum(s[(c, path)].cpu_ms_per_1k.values())


def db_predicted_cost(s: Table, c: int, workers: int) -> float:
    """The throughput PostgreSQL should cost on full cores, from CPU alone: its server's CPU and
    the api's extra CPU over SQLite per token, against everything SQLite's path spends (only the
    database's share: Triton's and the client's own CPU per token are the same work on both
    paths, and their batch-to-batch noise would swamp it)."""
    pg, lite = s[(c, Config(workers, "postgresql").name)], s[(c, Config(workers, "sqlite").name)]
    extra = pg.cpu_ms_per_1k["db"] + pg.cpu_ms_per_1k["api"] - lite.cpu_ms_per_1k["api"]
    base = (
        total_ms(s, c, lite_name := Config(workers, "sqlite").name)
        - s[(c, lite_name)].cpu_ms_per_1k["db"]
    )
    return extra / (base + extra)


def spread(r: Summary) -> float:
    """(fastest - slowest batch) / median batch: how far one path's repeats disagree."""
    return (max(r.per_batch) - min(r.per_batch)) / r.tok_s


def saturated(s: Table, c: int, path: str) -> bool:
    return s[(c, path)].busy >= SATURATED * cores()


def targets(s: Table, configs: list[Config], concurrencies: list[int]) -> list[str]:
    c = TARGET_C if TARGET_C in concurrencies else max(concurrencies)
    api = {x: s[(c, x.name)].cpu_ms_per_1k["api"] for x in configs}
    added = {x: s[(c, x.name)].ttft_p50_ms - s[(c, GRPC)].ttft_p50_ms for x in configs}
    free = [x for x in configs if not saturated(s, c, x.name)]
    out = ["## Targets", ""]
    out.append(
        f"- api CPU per 1 000 output tokens at c={c} ≤ {TARGET_API_MS:.0f} ms: "
        f"{_verdict(all(v <= TARGET_API_MS for v in api.values()))} — "
        + ", ".join(f"{x.name}: {v:.0f} ms" for x, v in api.items())
        + "."
    )
    busy = ", ".join(
        f"{x.name}: {added[x]:+.0f} ms (busy {s[(c, x.name)].busy:.2f})" for x in configs
    )
    if free:
        verdict = _verdict(all(added[x] <= TARGET_TTFT_MS for x in free))
        scope = f"rows with free cores: {', '.join(x.name for x in free)}"
    else:
        verdict = "**not met (not measurable here)**"
        scope = f"every c={c} row had the cores saturated (≥ {SATURATED:.0%} of {cores()} busy)"
    out.append(
        f"- Added TTFT p50 at c={c} ≤ {TARGET_TTFT_MS:.0f} ms where the cores are not "
        f"saturated: {verdict} — {scope}; all rows, busy cores in brackets: {busy}."
    )
    costs = {
        (w, cc): 1
        - s[(cc, Config(w, "postgresql").name)].tok_s / s[(cc, Config(w, "sqlite").name)].tok_s
        for w in sorted({x.workers for x in configs})
        for cc in concurrencies
        if (cc, Config(w, "postgresql").name) in s and (cc, Config(w, "sqlite").name) in s
    }
    if costs:
        predicted = [db_predicted_cost(s, cc, w) for w, cc in costs]
        out.append(
            f"- Logging to PostgreSQL costs ≤ {TARGET_DB_COST:.0%} throughput (vs SQLite, same "
            f"workers and concurrency): {_verdict(max(costs.values()) <= TARGET_DB_COST)} — "
            + ", ".join(f"×{w} c={cc}: {v:+.1%}" for (w, cc), v in costs.items())
            + f". From CPU alone (PostgreSQL's server and the api's extra CPU per token, on full "
            f"cores) it should cost {min(predicted):+.1%} to {max(predicted):+.1%}; measured "
            "differences within the batches' spread are the shared machine's noise (below)."
        )
    return [*out, ""]


def why(s: Table, configs: list[Config], concurrencies: list[int], interval: float) -> list[str]:
    c = TARGET_C if TARGET_C in concurrencies else max(concurrencies)
    n = cores()
    out = ["## Why: what the cores allow", ""]
    rows = []
    for cc in concurrencies:
        pace = cc / interval
        for path in [GRPC, *(x.name for x in configs)]:
            r = s[(cc, path)]
            need = total_ms(s, cc, path) * pace / 1e6
            ceiling = (n - r.others) * 1e6 / total_ms(s, cc, path)
            rows.append(
                f"| {cc} | {path} | {pace:.0f} | {r.tok_s:.0f} | {total_ms(s, cc, path):.0f} | "
                f"{need:.2f} | {ceiling:.0f} | {r.busy:.2f} | {r.others:.2f} |"
            )
    out += [
        "The load generator, tritonserver, the api workers and PostgreSQL share the machine's "
        f"{n} cores with other people's work. The table puts each row's throughput beside what "
        "the CPU allows: *CPU ms / 1k tok* is every process on the path (Triton + api + "
        "PostgreSQL + this client) per 1 000 output tokens; *cores needed* is that at the "
        "engine's pace (concurrency / interval); *CPU ceiling* is the throughput the cores "
        "the others left free could carry at that cost (approximate: the others' load is not "
        "fixed, the scheduler shares the cores between them and us). Where the cores needed "
        "exceed the "
        "cores there are, throughput is the CPU ceiling, not the engine's pace, and adding "
        "workers cannot raise it: they add processes, not cores.",
        "",
        "| concurrency | path | engine pace tok/s | measured tok/s | CPU ms / 1k tok (all) "
        f"| cores needed | CPU ceiling tok/s | busy cores (of {n}) | others' cores |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]
    api = ", ".join(f"{x.name} {s[(c, x.name)].cpu_ms_per_1k['api']:.0f}" for x in configs)
    few, many = min(x.workers for x in configs), max(x.workers for x in configs)

    def api_ms(workers: int, database: str, cc: int) -> float:
        return s[(cc, Config(workers, database).name)].cpu_ms_per_1k["api"]

    growth = ", ".join(
        f"{DATABASES[d]} ×{api_ms(many, d, cc) / api_ms(few, d, cc):.2f} at c={cc}"
        for d in dict.fromkeys(x.database for x in configs)
        for cc in concurrencies
    )
    out.append(
        f"**api CPU per token.** At c={c} the api's process tree spent (ms per 1 000 tokens) "
        f"{api}. Workers divide the same per-token work (parse, relay, detokenised text to SSE, "
        "the row) among processes; each adds its own event loop, gRPC channel, database "
        "threads, heartbeat and, while it streams, its poll for cross-worker cancels, so the "
        f"sum over the tree does not fall with more workers; from {few} to {many} workers it "
        f"changed by {growth}. Meeting the target takes a cheaper per-token path in the api "
        "itself, not more workers."
    )
    out.append("")
    ttft = ", ".join(
        f"c={cc} {x.name} {s[(cc, x.name)].ttft_p50_ms - s[(cc, GRPC)].ttft_p50_ms:+.0f} ms "
        f"(busy {s[(cc, x.name)].busy:.2f})"
        for cc in concurrencies
        for x in configs
        if x.workers in (min(y.workers for y in configs), max(y.workers for y in configs))
        and x.database == configs[0].database
    )
    out.append(
        "**Added TTFT.** A closed loop starts each wave of requests together; the api admits "
        "them on its event loops while relaying the other streams' tokens, so the added TTFT "
        "is the queue of CPU work in front of a new request. With the cores saturated it "
        "measures the shortage of CPU, not the api's own latency; a batch's busy cores are an "
        "average over its wall time, and each wave's admission is a burst of CPU work that can "
        f"fill the cores for a moment even where the average has room. Δ TTFT p50 vs gRPC: {ttft}."
    )
    out.append("")
    pg = []
    for cc in concurrencies:
        for x in configs:
            lite = Config(x.workers, "sqlite").name
            if x.database != "postgresql" or (cc, lite) not in s:
                continue
            r, base = s[(cc, x.name)], s[(cc, lite)]
            # On full cores throughput goes as 1 / (CPU per token): the cost the CPU predicts.
            predicted = db_predicted_cost(s, cc, x.workers)
            pg.append(
                f"| {x.workers} | {cc} | {1 - r.tok_s / base.tok_s:+.1%} | {predicted:+.1%} | "
                f"{r.cpu_ms_per_1k['db']:.0f} | {r.cpu_ms_per_1k['api']:.0f} · "
                f"{base.cpu_ms_per_1k['api']:.0f} | {spread(r):.0%} · {spread(base):.0%} | "
                f"{r.busy:.2f} · {base.busy:.2f} |"
            )
    if pg:
        out += [
            "**PostgreSQL vs SQLite.** PostgreSQL's server runs on the same cores, so where they "
            "are full its CPU, and the api's own database work, are taken from Triton and the "
            "relay; throughput then goes as 1 / (CPU per token), so the CPU measured predicts "
            "the cost. *Spread* is (fastest - slowest batch) / median of one path: a difference "
            "in throughput smaller than it is the shared machine's noise, not the database.",
            "",
            "| workers | concurrency | throughput cost, measured | cost the CPU predicts "
            "| PostgreSQL server CPU ms / 1k tok | api CPU ms / 1k tok: PostgreSQL · SQLite "
            "| spread: PostgreSQL · SQLite | busy cores: PostgreSQL · SQLite |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
            *pg,
            "",
        ]
    return out


def report(
    batches: list[Batch], args: argparse.Namespace, elapsed_s: float, others: float, commit: str
) -> str:
    s = summaries(batches)
    concurrencies = sorted({b.concurrency for b in batches})
    configs = [Config(w, d) for d in args.databases for w in args.workers]
    out = header(args, batches, elapsed_s, others, commit)
    for c in concurrencies:
        out += table(s, c, configs)
    out += targets(s, configs, concurrencies)
    out += why(s, configs, concurrencies, args.interval)
    return "\n".join(out) + "\n"
