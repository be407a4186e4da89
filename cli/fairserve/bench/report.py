"""The DESIGN §7 report of a bench run, from the clients' side.

The simulator's :func:`~fairserve.sim.report.build_report` owns the key names and the
formulas (throughput, Jain's index over the window where every client is active, the largest
service gap between backlogged clients, percentiles). This module only turns HTTP
measurements into its input, a :class:`~fairserve.sim.recorder.SimResult`, so ``simulate
--json`` and ``bench --json`` cannot drift apart; then it adds what only a client sees:
errors by status, calls never sent, and the upstream as one "worker" (its busy fraction is
not visible from outside, so it is null).

Errors are calls that failed. Calls still open when the run ended (``unfinished``) and
calls never sent because a call they depend on was not answered (``skipped``) are counted
apart, each with the reason, so a run where nothing failed reports no errors.

Client view of service: ``w_e`` per prompt token when the first token arrives (the prompt
was processed), ``w_q`` per output token spread evenly until the answer ends, with the
weights of :class:`~fairserve.core.cost.WeightedTokenCost` (the routers' and policies'
default). Jain's index is over service divided by each client's weight, the router's
weights when it publishes them (as ``top`` shows), else the workload's. A client is
backlogged while it has a call due and unanswered.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fairserve.bench.client import OK, SKIPPED, UNFINISHED, Attempt
from fairserve.bench.fairness import live_fairness, service_events
from fairserve.bench.runner import BenchResult
from fairserve.core.metrics import ServiceSample, sample_at
from fairserve.sim.engine import EngineStats
from fairserve.sim.recorder import ClientCounters, RequestRecord, SimResult
from fairserve.sim.report import build_report

NOT_ERRORS = frozenset({UNFINISHED, SKIPPED})
"""Outcomes that end a call without a failure: the run ended first."""
SAMPLES = 500
"""Points on the service grid (fairness metrics and plots read it)."""


def bench_report(result: BenchResult) -> dict[str, Any]:
    """One JSON-able object with the §7 keys plus ``errors`` and per-client ``errors``."""
    sim = to_sim_result(result)
    meta = {"workload": result.workload, "url": result.url, "api": result.api}
    report = build_report(sim, {**meta, "seed": result.seed})
    report["target_duration_s"] = result.duration_s
    report["drain_timeout_s"] = result.timeout_s
    report["jain_weighted"] = True
    report["jain_weights"] = "router" if result.server_weights is not None else "workload"
    report["workers"] = [_upstream(result)]
    report["fairness"] = live_fairness(result.attempts, sim.weights, sim.end_s)
    by_client = _errors_by_client(result.attempts)
    skipped = Counter(a.client for a in result.attempts if a.status == SKIPPED)
    window_rates = _window_rates(sim, report["jain_window_s"])
    for name, entry in report["clients"].items():
        entry["window_service_rate"] = window_rates.get(name, 0.0)
        entry["errors"] = dict(by_client.get(name, {}))
        entry["unsent"] = result.unsent.get(name, 0)
        entry["skipped"] = skipped.get(name, 0)
    report["errors"] = _errors_summary(by_client)
    report["unfinished"] = _apart(result, UNFINISHED, unfinished_message(result))
    report["skipped"] = _apart(result, SKIPPED, "")
    report["identity"] = _identity(result)
    report["interrupted_s"] = result.interrupted_s
    return report


def _identity(result: BenchResult) -> dict[str, Any]:
    """How the router told the clients apart, and a note when it could not tell the
    workload's clients apart (one API key sent for several): the per-client figures and
    Jain's index are then the bench's split, not what the router's fairness saw."""
    merged = [list(group) for group in result.merged]
    note = None
    if merged:
        groups = "; ".join(", ".join(group) for group in merged)
        note = (
            f"the router identifies clients by API key ({result.auth_mode}) and these "
            f"clients were sent with one key, so it served each group as one client: "
            f"{groups}; the per-client figures and Jain's index split them by the names "
            "the bench sent, which the router ignored (give each client its own key)"
        )
    return {"auth_mode": result.auth_mode, "merged": merged, "note": note}


def _window_rates(sim: SimResult, window: list[float]) -> dict[str, float]:
    """Service per second inside the Jain window (where every client is active), the rate
    a fair split is judged by: over the whole run, the drain after arrivals stop serves
    each client's remaining backlog and pulls the rates back toward the demand ratio."""
    start_s, end_s = window
    if end_s <= start_s:
        return {}
    first, last = sample_at(sim.samples, start_s), sample_at(sim.samples, end_s)
    return {
        name: (last.cumulative.get(name, 0.0) - first.cumulative.get(name, 0.0)) / (end_s - start_s)
        for name in sim.clients
    }


def unfinished_message(result: BenchResult) -> str:
    """Why calls were still open: what ``--duration`` and ``--timeout`` mean, or that the
    run was interrupted."""
    if result.interrupted_s is not None:
        return (
            f"still open when the run was interrupted (Ctrl-C) at {result.interrupted_s:.1f} s; "
            "not errors"
        )
    return (
        f"still open when the run ended: arrivals stopped at {result.duration_s:g} s "
        f"(--duration) and calls in flight then had {result.timeout_s:g} s (--timeout) "
        "to finish; not errors"
    )


def _apart(result: BenchResult, status: str, message: str) -> dict[str, Any]:
    """Calls that ended as ``status`` (not errors), by client and by reason."""
    mine = [a for a in result.attempts if a.status == status]
    by_client = Counter(a.client for a in mine)
    reasons = Counter(a.message or message for a in mine)
    return {
        "total": len(mine),
        "by_client": dict(sorted(by_client.items())),
        "reasons": dict(sorted(reasons.items())),
    }


def to_sim_result(result: BenchResult) -> SimResult:
    """The run as the simulator's result type (for ``build_report`` and ``plot_runs``)."""
    names = [c.name for c in result.clients]
    names += sorted({a.client for a in result.attempts} - set(names))
    end_s = max(result.elapsed_s, 1e-9)
    done = [a for a in result.attempts if a.ok]
    prompt = sum(a.prompt_tokens for a in done)
    cached = sum(a.cached_tokens for a in done)
    samples, queue = _samples(result.attempts, names, end_s)
    stats = EngineStats(prompt_tokens=prompt, cached_tokens=cached, finished=len(done))
    unfinished = Counter(a.client for a in result.attempts if a.status == UNFINISHED)
    weights = {c.name: c.weight for c in result.clients}
    if result.server_weights is not None:
        weights.update({n: w for n, w in result.server_weights.items() if n in names})
    return SimResult(
        end_s=end_s,
        clients=names,
        weights=weights,
        counters=_counters(result.attempts, names),
        service={name: samples[-1].cumulative.get(name, 0.0) for name in names},
        samples=samples,
        records=[_record(a) for a in done],
        worker_ids=[result.url],
        worker_stats=[stats],
        worker_finished=[len(done)],
        unfinished=dict(unfinished),
        queue_samples=queue,
    )


def _record(a: Attempt) -> RequestRecord:
    finish_s = a.finish_s if a.finish_s is not None else a.arrival_s
    first_s = a.first_token_s if a.first_token_s is not None else finish_s
    return RequestRecord(
        a.client, 0, a.arrival_s, first_s, finish_s,
        a.prompt_tokens, a.cached_tokens, a.completion_tokens,
    )  # fmt: skip


def _counters(attempts: list[Attempt], names: list[str]) -> dict[str, ClientCounters]:
    counters = {name: ClientCounters() for name in names}
    for a in attempts:
        c = counters[a.client]
        if a.sent_s is not None:
            c.submitted += 1
        if a.ok:
            c.input_tokens += a.prompt_tokens
            c.output_tokens += a.completion_tokens
        elif a.status not in NOT_ERRORS:
            c.rejected += 1
        if c.first_arrival_s is None:
            c.first_arrival_s = a.arrival_s
        c.first_arrival_s = min(c.first_arrival_s, a.arrival_s)
        c.last_arrival_s = max(c.last_arrival_s or 0.0, a.arrival_s)
    return counters


def _backlog_events(attempts: list[Attempt], end_s: float) -> list[tuple[float, str, int, int]]:
    """``(t_s, client, outstanding delta, waiting delta)`` for every call sent."""
    events: list[tuple[float, str, int, int]] = []
    for a in attempts:
        if a.sent_s is None:
            continue
        finish_s = a.finish_s if a.finish_s is not None else end_s
        first_s = a.first_token_s if a.first_token_s is not None else finish_s
        events += [(a.arrival_s, a.client, 1, 1), (first_s, a.client, 0, -1)]
        events.append((finish_s, a.client, -1, 0))
    return events


def _samples(
    attempts: list[Attempt], names: list[str], end_s: float
) -> tuple[list[ServiceSample], list[tuple[float, int]]]:
    """Cumulative service and the backlogged set on a grid; calls waiting for a first token."""
    service = sorted(service_events(attempts))
    backlog = sorted(_backlog_events(attempts, end_s), key=lambda e: e[0])
    cumulative = dict.fromkeys(names, 0.0)
    outstanding = dict.fromkeys(names, 0)
    waiting = 0
    i = j = 0
    samples: list[ServiceSample] = []
    queue: list[tuple[float, int]] = []
    for k in range(SAMPLES + 1):
        t_s = end_s * k / SAMPLES
        while i < len(service) and service[i][0] <= t_s:
            cumulative[service[i][1]] += service[i][2]
            i += 1
        while j < len(backlog) and backlog[j][0] <= t_s:
            _, client, d_out, d_wait = backlog[j]
            outstanding[client] += d_out
            waiting += d_wait
            j += 1
        busy = frozenset(c for c, n in outstanding.items() if n > 0)
        samples.append(ServiceSample(t_s, dict(cumulative), busy))
        queue.append((t_s, waiting))
    for _, client, amount in service[i:]:  # rounding at the last grid point
        cumulative[client] += amount
    if service[i:]:
        samples[-1] = ServiceSample(samples[-1].t_s, dict(cumulative), samples[-1].backlogged)
    return samples, queue


def _upstream(result: BenchResult) -> dict[str, Any]:
    done = [a for a in result.attempts if a.ok]
    prompt = sum(a.prompt_tokens for a in done)
    cached = sum(a.cached_tokens for a in done)
    return {
        "id": result.url,
        "requests": len(done),
        "cache_hit_rate": cached / prompt if prompt else 0.0,
        "busy_fraction": None,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
    }


def _errors_by_client(attempts: list[Attempt]) -> dict[str, Counter[str]]:
    """Every call that failed, by client and status (unfinished and skipped are not)."""
    out: dict[str, Counter[str]] = {}
    for a in attempts:
        if a.status != OK and a.status not in NOT_ERRORS:
            out.setdefault(a.client, Counter())[a.status] += 1
    return out


def _errors_summary(by_client: dict[str, Counter[str]]) -> dict[str, Any]:
    total: Counter[str] = Counter()
    for counts in by_client.values():
        total.update(counts)
    return {
        "total": sum(total.values()),
        "by_status": dict(sorted(total.items())),
        "by_client": {c: dict(sorted(n.items())) for c, n in sorted(by_client.items())},
    }


def first_messages(attempts: list[Attempt]) -> dict[str, str]:
    """One server message per failing status (the first seen), for the human view."""
    out: dict[str, str] = {}
    for a in attempts:
        failed = a.status != OK and a.status not in NOT_ERRORS
        if failed and a.message and a.status not in out:
            out[a.status] = a.message
    return out
