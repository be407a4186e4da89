"""The report of DESIGN §7, built from a :class:`~fairserve.sim.recorder.SimResult`.

Key names are a contract shared with ``fairserve bench --json``; change them only together
with the design. Times are simulated seconds; rates are per simulated second over the run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fairserve.core.metrics import jain_index, max_service_gap, percentile, sample_at
from fairserve.sim.programs import programs_report
from fairserve.sim.recorder import RequestRecord, SimResult


def build_report(result: SimResult, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """One JSON-able object: throughput, cache hits, fairness, per-client, per-worker."""
    span_s = max(result.end_s, 1e-9)
    total_in = sum(c.input_tokens for c in result.counters.values())
    total_out = sum(c.output_tokens for c in result.counters.values())
    prompt = sum(s.prompt_tokens for s in result.worker_stats)
    cached = sum(s.cached_tokens for s in result.worker_stats)
    window = _active_window(result)
    report: dict[str, Any] = dict(meta or {})
    report.update(
        {
            "duration_s": result.end_s,
            "throughput": {
                "tokens_per_s": (total_in + total_out) / span_s,
                "service_per_s": sum(result.service.values()) / span_s,
                "requests_per_s": len(result.records) / span_s,
            },
            "cache_hit_rate": cached / prompt if prompt else 0.0,
            "jain_index": _jain(result, window),
            "jain_window_s": list(window),
            "max_service_gap": max_service_gap(result.samples).value,
            "max_service_gap_extend": max_service_gap(result.samples_extend).value,
            "service_gap_bound": service_gap_bound(result.bound_inputs),
            "queue": _queue(result),
            "conservation": _conservation(result),
            "clients": _clients(result, span_s),
            "workers": _workers(result, span_s),
            "programs": programs_report(result.programs, result.programs_unfinished),
        }
    )
    return report


def _clients(result: SimResult, span_s: float) -> dict[str, dict[str, Any]]:
    by_client: dict[str, list[RequestRecord]] = {c: [] for c in result.clients}
    for record in result.records:
        by_client.setdefault(record.client, []).append(record)
    out: dict[str, dict[str, Any]] = {}
    for name in result.clients:
        records = by_client.get(name, [])
        latencies = [r.latency_s for r in records]
        ttfts = [r.ttft_s for r in records]
        counters = result.counters[name]
        out[name] = {
            "weight": result.weights.get(name, 1.0),
            "requests": len(records),
            "submitted": counters.submitted,
            "rejected": counters.rejected,
            "unfinished": result.unfinished.get(name, 0),
            "input_tokens": counters.input_tokens,
            "output_tokens": counters.output_tokens,
            "service": result.service.get(name, 0.0),
            "service_rate": result.service.get(name, 0.0) / span_s,
            "latency_p50_s": _finite(percentile(latencies, 50)),
            "latency_p99_s": _finite(percentile(latencies, 99)),
            "ttft_p50_s": _finite(percentile(ttfts, 50)),
            "ttft_p99_s": _finite(percentile(ttfts, 99)),
        }
    return out


def service_gap_bound(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The theorem that bounds the gap between continuously backlogged clients for what
    ran, its value for the run's parameters and the view it bounds; ``value`` is None with
    a ``reason`` where no theorem applies.

    Why in the report: ``max_service_gap`` counts cached prompt tokens (the client's view)
    while the theorems bound charged service, extend tokens with the default costs (the
    system's view, ``max_service_gap_extend``); an operator must compare like with like.
    ``M`` is the KV capacity of a worker in tokens, ``L_input`` the longest prompt."""
    policy, workers = inputs.get("policy"), int(inputs.get("workers", 1))
    w_e, w_q = float(inputs.get("w_e", 1.0)), float(inputs.get("w_q", 2.0))
    m_tokens = float(inputs.get("kv_capacity_tokens", 0))
    l_input = float(inputs.get("longest_input_tokens", 0))
    params = inputs.get("policy_params", {})
    view = "client" if params.get("charge_cached") else "extend"
    out: dict[str, Any] = {"value": None, "view": view, "theorem": None, "reason": None}
    if policy == "vtc":
        if workers != 1:
            out["reason"] = "VTC Theorem 4.4 is for one worker; VTC keeps no cluster-wide counter"
            return out
        out["value"] = 2 * max(w_e * l_input, w_q * m_tokens)
        out["theorem"] = "VTC Theorem 4.4: 2·max(w_p·L_input, w_q·M)"
        return out
    if policy == "dlpm":
        u = w_e * l_input + w_q * m_tokens
        quantum = float(inputs.get("quantum") or 0.0)
        if workers == 1:
            out["value"] = 2 * (u + quantum)
            out["theorem"] = "DLPM Theorem 4.1: 2·(U + Q^u), U = w_e·L_input + w_q·M"
        elif inputs.get("dispatch") == "doubleq":
            out["value"] = 2 * workers * (u + quantum)
            out["theorem"] = "DoubleQ Theorem 5.1: 2·|W|·(U + Q^u), U = w_e·L_input + w_q·M"
        else:
            out["reason"] = (
                f"dispatcher {inputs.get('dispatch')} does not keep every backlogged client "
                "backlogged on every worker (Theorem 5.1's premise)"
            )
        return out
    if policy == "lcf":
        out["reason"] = "LCF has no lift: a client back from idle spends saved credit (no bound)"
    elif policy == "justitia":
        out["reason"] = "Justitia bounds completion delay, not service (see programs)"
    else:
        out["reason"] = f"policy {policy} has no fairness theorem"
    return out


def _conservation(result: SimResult) -> dict[str, Any]:
    """Every submitted call is finished, unfinished (still queued, running or finishing in
    a step past the end) or rejected; ``holds`` says the three add up, for every client."""
    finished: dict[str, int] = {}
    for record in result.records:
        finished[record.client] = finished.get(record.client, 0) + 1
    totals = {"submitted": 0, "finished": 0, "unfinished": 0, "rejected": 0}
    holds = True
    for name, counters in result.counters.items():
        done, open_, refused = (
            finished.get(name, 0),
            result.unfinished.get(name, 0),
            counters.rejected,
        )
        holds = holds and done + open_ + refused == counters.submitted
        for key, value in zip(totals, (counters.submitted, done, open_, refused), strict=True):
            totals[key] += value
    return {**totals, "holds": holds}


def _workers(result: SimResult, span_s: float) -> list[dict[str, Any]]:
    return [
        {
            "id": worker,
            "requests": result.worker_finished[i],
            "cache_hit_rate": stats.cache_hit_rate,
            "busy_fraction": min(1.0, stats.busy_s / span_s),
            "prompt_tokens": stats.prompt_tokens,
            "cached_tokens": stats.cached_tokens,
            "decode_tokens": stats.decode_tokens,
            "steps": stats.steps,
            "retracted": stats.retracted,
        }
        for i, (worker, stats) in enumerate(
            zip(result.worker_ids, result.worker_stats, strict=True)
        )
    ]


def _queue(result: SimResult) -> dict[str, float]:
    """Queue depth: its peak, mean and value at the end; a queue whose second-half mean far
    exceeds its first-half mean is not stable at this load. Queued = waiting for admission
    plus admitted but parked (holding KV without getting tokens: vLLM-v0's decodes behind
    its prefill-only steps, which a waiting-only count hid: 3 queued with 2,061 requests in
    the system). ``conservation.unfinished`` at the end is everything in the system."""
    depths = [q for _, q in result.queue_samples]
    half = len(depths) // 2
    first, second = depths[:half] or [0], depths[half:] or [0]
    return {
        "max": float(max(depths, default=0)),
        "mean": sum(depths) / len(depths) if depths else 0.0,
        "end": float(depths[-1]) if depths else 0.0,
        "first_half_mean": sum(first) / len(first),
        "second_half_mean": sum(second) / len(second),
    }


def _active_window(result: SimResult) -> tuple[float, float]:
    """Where every client is active: after the last client's first call and before the
    first client's last call (the whole run when that is empty)."""
    firsts = [c.first_arrival_s for c in result.counters.values()]
    lasts = [c.last_arrival_s for c in result.counters.values()]
    if not firsts or any(t is None for t in firsts):
        return (0.0, result.end_s)
    start = max(t for t in firsts if t is not None)
    end = min(min(t for t in lasts if t is not None), result.end_s)
    if end - start <= result.end_s * 0.05:
        return (0.0, result.end_s)
    return (start, end)


def _jain(result: SimResult, window: tuple[float, float]) -> float:
    """Jain's index over weight-normalised service rates inside ``window``."""
    start = sample_at(result.samples, window[0])
    end = sample_at(result.samples, window[1])
    rates = [
        (end.cumulative.get(c, 0.0) - start.cumulative.get(c, 0.0)) / result.weights.get(c, 1.0)
        for c in result.clients
    ]
    return jain_index(max(0.0, r) for r in rates)


def _finite(value: float) -> float | None:
    """JSON has no NaN: a percentile over no requests is null."""
    return None if math.isnan(value) else value
