#!/usr/bin/env python3
"""Regenerate the paper-vs-simulator table, docs/paper-table.md.

    python scripts/paper_table.py          # every row (several minutes on 2 cores)
    python scripts/paper_table.py --fast   # the rows CI runs (tests/docs/test_paper_table.py)
    python scripts/paper_table.py --only doubleq  # one paper's rows, the others kept
    python scripts/paper_table.py --out -  # print instead of writing

One row per published result of VTC, DLPM, DoubleQ, Justitia and the throughput-optimal
batching paper: the paper's figure, its number, ours, their ratio and whether it holds. A
result holds when it points the same way as the paper's and, where the paper gives a ratio
as its finding (not an "up to" maximum), ours is within 15% of it; a row that does not hold
says why. Every run is seeded and deterministic: the same checkout gives the same table.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import os
import platform
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "paper-table.md"
RATIO_TOLERANCE = 0.15


@dataclass(frozen=True)
class Row:
    """One published result against the simulator's."""

    paper: str
    figure: str
    claim: str
    paper_value: float
    ours: float
    holds: bool
    exact: bool = False
    """The paper states this value as its finding (ratio must be within 15%), rather than
    a bound or an "up to" maximum (direction only)."""
    why_not: str = ""
    setting: str = ""

    @property
    def ratio(self) -> float:
        return self.ours / self.paper_value if self.paper_value else float("nan")


def direction_row(
    paper: str, figure: str, claim: str, paper_value: float, ours: float, ok: bool, **kw: Any
) -> Row:
    return Row(paper, figure, claim, paper_value, ours, ok, **kw)


def ratio_row(
    paper: str, figure: str, claim: str, paper_value: float, ours: float, ok: bool, **kw: Any
) -> Row:
    """Holds when it points the paper's way (``ok``) and is within 15% of its value."""
    close = abs(ours / paper_value - 1) <= RATIO_TOLERANCE
    return Row(paper, figure, claim, paper_value, ours, ok and close, exact=True, **kw)


# ------------------------------------------------------------------ simulations


def simulate(
    workload: Any,
    policy: str,
    dispatch: str = "round-robin",
    *,
    workers: int = 1,
    profile: str | None = None,
    kv_capacity_tokens: int | None = None,
    batching: str = "sarathi",
    drain: bool = False,
    duration_s: float | None = None,
    **extra: Any,
) -> tuple[dict[str, Any], Any]:
    """One seeded run: (the DESIGN §7 report, the finished ClusterSim)."""
    from fairserve.sim.cluster import ClusterSim, SimConfig
    from fairserve.sim.profile import DEFAULT_PROFILE, resolve_profile
    from fairserve.sim.report import build_report

    prof = resolve_profile(profile or DEFAULT_PROFILE)
    config = SimConfig(
        engine=prof.engine_config(batching, kv_capacity_tokens=kv_capacity_tokens),
        time_model=prof.batch_time(),
        policy=policy,
        dispatch=dispatch,
        workers=workers,
        drain=drain,
        duration_s=duration_s,
        **extra,
    )
    sim = ClusterSim(workload, config)
    return build_report(sim.run()), sim


def builtin(name: str) -> Any:
    from fairserve.workloads import load_builtin

    return load_builtin(name)


def workload_text(text: str) -> Any:
    from fairserve.workloads import loads_workload

    return loads_workload(text, "<paper_table>")


# ------------------------------------------------------------------ VTC


def vtc_rows() -> list[Row]:
    """VTC §5.2 (Fig. 3, constant overload): two clients at 1:2 rates, both above their
    share, get equal service; FCFS serves them in proportion to their rates."""
    workload = builtin("vtc-constant")
    vtc, _ = simulate(workload, "vtc", duration_s=60)
    fcfs, _ = simulate(workload, "fcfs", duration_s=60)

    def ratio(report: dict[str, Any]) -> float:
        clients = report["clients"]
        return float(clients["client1"]["service"] / clients["client2"]["service"])

    setting = "vtc-constant, 60 s, 1 worker, a100-llama-3-8b, seed 1"
    return [
        ratio_row("VTC", "Fig. 3", "service ratio client1:client2 under VTC", 1.0,
                  ratio(vtc), True, setting=setting),
        ratio_row("VTC", "Fig. 3", "service ratio client1:client2 under FCFS (= rates)", 0.5,
                  ratio(fcfs), True, setting=setting),
    ]  # fmt: skip


VTC_PAPER_KV_TOKENS = 10_000
"""The VTC paper's KV pool (§5.1, footnote 7: Llama-2-7B on an A10G under S-LoRA)."""


@functools.cache
def vtc_paper_profile() -> Path:
    """The VTC paper's testbed as a profile file: Llama-2-7B on an A10G, scaled from the
    a40-llama-2-7b fit as scripts/derive_profiles.py scales a10g-llama-3.2-3b (estimated:
    there is no published A10G data), with the paper's 10,000-token KV pool. Not shipped in
    profiles/ yet: the profiler's quick sweep cannot time mixed steps on a pool this small."""
    import dataclasses
    import tempfile

    sys.path.insert(0, str(REPO / "scripts"))
    import derive_profiles as derive

    from fairserve.sim.profile import profile_to_toml

    model = derive.MODELS["llama-2-7b"]
    base = derive.derive(derive.DEFAULT_REFERENCE)["a40-llama-2-7b"]
    scaled = derive.scaled_profile("a10g-llama-2-7b", derive.GPUS["a10g"], model, base, model)
    profile = dataclasses.replace(scaled, kv_capacity_tokens=VTC_PAPER_KV_TOKENS)
    path = Path(tempfile.mkdtemp(prefix="paper-table-")) / "a10g-llama-2-7b.toml"
    path.write_text(profile_to_toml(profile), encoding="utf-8")
    return path


def vtc_paper_workload(name: str, clients: list[tuple[str, str, float]], extra: str = "") -> Any:
    """Clients of 256 in / 256 out at the paper's rates (requests per minute)."""
    text = [f'name = "{name}"\nduration_s = 600\nseed = 1\n']
    for client, arrival, per_min in clients:
        text.append(
            f'[[clients]]\nname = "{client}"\narrival = "{arrival}"\n'
            f"rate_per_s = {per_min / 60:.6g}\ninput_tokens = 256\noutput_tokens = 256\n"
            + (extra if arrival == "on-off" else "")
        )
    return workload_text("\n".join(text))


def vtc_paper_rows() -> list[Row]:
    """VTC §5.2 at the paper's own rates on its testbed (one A10G, Llama-2-7B, 10,000 KV
    tokens; estimated profile, see :func:`vtc_paper_profile`), 600 s."""
    profile = str(vtc_paper_profile())
    capacity = (
        simulate(vtc_paper_workload("capacity", [("a", "uniform", 300)]), "fcfs", profile=profile)[
            0
        ]["throughput"]["requests_per_s"]
        * 60
    )
    fig3 = vtc_paper_workload("fig3", [("client1", "uniform", 90), ("client2", "uniform", 180)])
    vtc3, fcfs3 = (simulate(fig3, p, profile=profile)[0]["clients"] for p in ("vtc", "fcfs"))
    fig4 = vtc_paper_workload(
        "fig4", [("client1", "uniform", 15), ("client2", "uniform", 30), ("client3", "uniform", 90)]
    )
    vtc4 = simulate(fig4, "vtc", profile=profile)[0]["clients"]
    share3 = vtc4["client3"]["service"] / sum(c["service"] for c in vtc4.values())
    fig5 = vtc_paper_workload(
        "fig5", [("client1", "on-off", 30), ("client2", "uniform", 120)], "on_s = 60\noff_s = 60\n"
    )
    vtc5 = simulate(fig5, "vtc", profile=profile)[0]["clients"]
    setting = (
        "paper's rates, 256 in / 256 out, 600 s, 1 x a10g-llama-2-7b (estimated), "
        "10,000 KV tokens, seed 1"
    )

    def ratio(clients: dict[str, Any], a: str, b: str) -> float:
        return float(clients[a]["service"] / clients[b]["service"])

    return [
        ratio_row("VTC", "§5.1 / Fig. 4",
                  "capacity at 256 in / 256 out, requests/min (Fig. 4: 15 = 2/13 of it)",
                  97.5, capacity, True, setting=setting),
        ratio_row("VTC", "Fig. 3", "90 and 180 req/min: service ratio under VTC", 1.0,
                  ratio(vtc3, "client1", "client2"), True, setting=setting),
        ratio_row("VTC", "Fig. 3", "90 and 180 req/min: service ratio under FCFS (= rates)", 0.5,
                  ratio(fcfs3, "client1", "client2"), True, setting=setting),
        ratio_row("VTC", "Fig. 4", "15, 30, 90 req/min: client1:client2 service (= rates)", 0.5,
                  ratio(vtc4, "client1", "client2"), True, setting=setting),
        ratio_row("VTC", "Fig. 4",
                  "15, 30, 90 req/min: client3 takes what the others leave (~7/13, > 1/3)",
                  7 / 13, share3, share3 > 1 / 3, setting=setting),
        direction_row("VTC", "Fig. 5",
                      "on/off 30 vs 120 req/min: client1's p99 latency / client2's (< 1)",
                      1.0, vtc5["client1"]["latency_p99_s"] / vtc5["client2"]["latency_p99_s"],
                      vtc5["client1"]["latency_p99_s"] < vtc5["client2"]["latency_p99_s"],
                      setting=setting),
    ]  # fmt: skip


# ------------------------------------------------------------------ throughput-optimal


def stability_rows() -> list[Row]:
    """Throughput-optimal batching (§4-5): at 0.9 of capacity the work-conserving
    disciplines (Sarathi, Orca) keep the queue bounded; FasterTransformer and vLLM-v0 do not."""
    from fairserve.sim.profile import DEFAULT_PROFILE, resolve_profile

    rate = 0.9 * resolve_profile(DEFAULT_PROFILE).capacity_tokens_per_s / 600
    workload = workload_text(
        f'name = "stability"\nduration_s = 120\nseed = 1\n\n[[clients]]\nname = "a"\n'
        f'arrival = "poisson"\nrate_per_s = {rate}\ninput_tokens = 500\noutput_tokens = 100\n'
    )
    rows = []
    setting = "one client at 0.9 of capacity (500 in / 100 out), 120 s, fcfs, seed 1"
    for batching, stable in (
        ("sarathi", True),
        ("orca", True),
        ("fastertransformer", False),
        ("vllm-v0", False),
    ):
        queue = simulate(workload, "fcfs", batching=batching)[0]["queue"]
        first, second = queue["first_half_mean"], queue["second_half_mean"]
        growth = second / max(first, 1.0)
        ours_stable = second <= first + 10 and queue["max"] < 100  # a few requests of noise
        why = ""
        if batching == "vllm-v0" and ours_stable:
            why = (
                "the engine model bounds vLLM-v0's batch below capacity but does not model "
                "what makes it unstable in the paper (issue 17 item 5, open)"
            )
        rows.append(
            direction_row(
                "Throughput-optimal", "Thm 4.1 / Fig. 4",
                f"{batching}: queue, 2nd/1st half mean ({'bounded' if stable else 'grows'})",
                1.0 if stable else 2.0, growth, ours_stable == stable, why_not=why,
                setting=setting,
            )
        )  # fmt: skip
    return rows


UNBOUNDED_KV_TOKENS = 50_000_000
"""A KV pool no run here fills: the paper's Fig. 1 is "when system memory is not a
constraint" (§3)."""


def served_rows() -> list[Row]:
    """Throughput-optimal batching §3 / Fig. 1, as the paper states it: memory not a
    constraint, load 0.9 of capacity; the work-conserving disciplines serve what arrives,
    FasterTransformer and vLLM-v0 cannot. vLLM-v0 runs a prefill-only step whenever a
    request arrives, so short prompts keep the decodes from batching up: its admitted
    requests hold memory without progress while the waiting queue stays near empty; the
    report's ``queue`` figure counts them (waiting or parked), as the paper's decode queue
    that builds up."""
    from fairserve.sim.profile import DEFAULT_PROFILE, resolve_profile

    duration_s = 240.0
    rate = 0.9 * resolve_profile(DEFAULT_PROFILE).capacity_tokens_per_s / 600
    workload = workload_text(
        f'name = "stability"\nduration_s = {duration_s:g}\nseed = 1\n\n[[clients]]\n'
        f'name = "a"\narrival = "poisson"\nrate_per_s = {rate}\ninput_tokens = 500\n'
        "output_tokens = 100\n"
    )
    rows = []
    for batching, stable in (
        ("sarathi", True),
        ("orca", True),
        ("fastertransformer", False),
        ("vllm-v0", False),
    ):
        report, sim = simulate(
            workload, "fcfs", batching=batching, kv_capacity_tokens=UNBOUNDED_KV_TOKENS
        )
        half_s = duration_s / 2
        served = sum(1 for r in sim.recorder.records if r.finish_s >= half_s) / (rate * half_s)
        in_system = report["conservation"]["unfinished"]
        rows.append(
            direction_row(
                "Throughput-optimal", "§3 / Fig. 1",
                f"{batching}, memory no constraint: served / offered, 2nd half "
                f"({'~1' if stable else '< 1'})",
                1.0, served, (served >= 0.95) == stable,
                setting=f"one client at 0.9 of capacity (500 in / 100 out), "
                f"{duration_s:g} s, fcfs, {UNBOUNDED_KV_TOKENS:,} KV tokens, seed 1; at the "
                f"end {in_system} requests in the system, {report['queue']['end']:g} of them "
                "queued (waiting, or admitted and getting no token)",
            )
        )  # fmt: skip
    return rows


# ------------------------------------------------------------------ Justitia


def justitia_rows() -> list[Row]:
    """Justitia §V (Figs. 8, 10, Thm 1) on the built-in justitia-mix (300 applications,
    3x intensity), one worker with an A100-40GB's KV pool, until every application ended."""
    workload = builtin("justitia-mix")
    runs = {}
    for policy in ("justitia", "vtc"):
        _, sim = simulate(
            workload, policy, profile="a100-llama-2-7b", kv_capacity_tokens=45_000, drain=True
        )
        runs[policy] = sim
    jct = {p: {r.app: r.completion_s for r in s.program_records} for p, s in runs.items()}
    mean = {p: sum(v.values()) / len(v) for p, v in jct.items()}
    no_later = sum(1 for a, t in jct["justitia"].items() if t <= jct["vtc"][a]) / len(jct["vtc"])
    delay = runs["justitia"].engines[0].policy.snapshot()["delay"]
    setting = "justitia-mix, 1 worker, a100-llama-2-7b with 45,000 KV tokens, oracle, seed 1"
    return [
        ratio_row("Justitia", "Fig. 8", "average completion time, Justitia / VTC", 0.425,
                  mean["justitia"] / mean["vtc"], mean["justitia"] < mean["vtc"],
                  setting=setting),
        ratio_row("Justitia", "Fig. 10", "applications finishing no later than under VTC",
                  0.92, no_later, no_later >= 0.85, setting=setting),
        direction_row("Justitia", "Thm 1", "max delay vs GPS / bound 2·c_max + C_max/M",
                      1.0, delay["max_delay_iterations"] / delay["bound_iterations"],
                      delay["max_delay_iterations"] <= delay["bound_iterations"],
                      setting=setting),
    ]  # fmt: skip


def _scaled_rate(factor: float, match: re.Match[str]) -> str:
    return f"rate_per_s = {float(match.group(1)) * factor:.6g}"


def justitia_intensity_rows() -> list[Row]:
    """Justitia Fig. 8 at the paper's lower intensities: the same ~300 applications over 9
    (2x) and 18 (1x) minutes instead of 6; Justitia's average completion time stays below
    VTC's (the paper: at every intensity)."""
    from fairserve.workloads.catalog import builtin_text

    rows = []
    for label, stretch in (("2x", 1.5), ("1x", 3.0)):
        text = re.sub(
            r"(?m)^rate_per_s = ([0-9.]+)$",
            functools.partial(_scaled_rate, 1 / stretch),
            builtin_text("justitia-mix"),
        ).replace("duration_s = 360", f"duration_s = {360 * stretch:g}")
        workload = workload_text(text)
        mean = {}
        for policy in ("justitia", "vtc"):
            _, sim = simulate(
                workload, policy, profile="a100-llama-2-7b", kv_capacity_tokens=45_000, drain=True
            )
            times = [r.completion_s for r in sim.program_records]
            mean[policy] = sum(times) / len(times)
        ratio = mean["justitia"] / mean["vtc"]
        rows.append(
            direction_row(
                "Justitia", "Fig. 8", f"average completion time, Justitia / VTC, {label}", 1.0,
                ratio, ratio < 1,
                setting=f"justitia-mix stretched to {label} ({360 * stretch:g} s), as above",
            )
        )  # fmt: skip
    return rows


# ------------------------------------------------------------------ DLPM


def dlpm_rows() -> list[Row]:
    """DLPM (§6, Fig. 1/7, one worker): on a prefix-heavy workload with a misbehaving client,
    DLPM keeps LPM's throughput with VTC-like fairness; above VTC's throughput."""
    text = ['name = "dlpm-long-qa"\nduration_s = 60\nseed = 1\n']
    for name, rate in [*((f"good{i}", 8) for i in range(4)), ("bad", 60)]:
        text.append(
            f'[[clients]]\nname = "{name}"\nprogram = "long-qa"\narrival = "poisson"\n'
            f"rate_per_s = {rate}\nshared_prefix_tokens = 2800\ninput_tokens = 200\n"
            f"output_tokens = 30\n"
        )
    workload = workload_text("\n".join(text))
    quanta: dict[str, dict[str, Any]] = {"lpm": {}, "vtc": {}, "dlpm": {"quantum": 64_000}}
    reports = {
        p: simulate(workload, p, kv_capacity_tokens=20_000, **q)[0] for p, q in quanta.items()
    }
    tput = {p: r["throughput"]["tokens_per_s"] for p, r in reports.items()}
    jain = {p: r["jain_index"] for p, r in reports.items()}
    setting = "long-QA S1 (4 good + 1 bad at 7.5x), 60 s, 1 worker, 20,000 KV tokens, seed 1"
    return [
        direction_row("DLPM", "Fig. 7", "throughput DLPM / VTC (paper: up to 2.87x)", 2.87,
                      tput["dlpm"] / tput["vtc"], tput["dlpm"] > tput["vtc"], setting=setting),
        direction_row("DLPM", "Fig. 1", "throughput DLPM / LPM (>= 0.95)", 1.0,
                      tput["dlpm"] / tput["lpm"], tput["dlpm"] >= 0.95 * tput["lpm"],
                      setting=setting),
        direction_row("DLPM", "Fig. 1", "Jain index DLPM (>= 0.9; VTC's is the best)", 0.9,
                      jain["dlpm"], jain["dlpm"] >= 0.9, setting=setting),
    ]  # fmt: skip


# ------------------------------------------------------------------ DoubleQ

DOUBLEQ_PROFILE = "a10g-llama-3.2-3b"
DOUBLEQ_WORKERS = 4
DOUBLEQ_WINDOW_S = 300.0
"""Arrivals stop here (every scenario's ``duration_s``); the runs go on until every call
finished (``drain``)."""
MISBEHAVING = ("long-qa-s1", "long-qa-s2", "tot-s1", "tot-s2", "judge")
LPM_IS_SJF = (
    "at equal request rates the misbehaving client's 2x longer documents do not overload the "
    "cluster under cache-aware + LPM (its queue stays bounded), and on long-QA LPM is "
    "shortest-job-first (a cache hit extends ~35 tokens, a miss a whole document): under "
    "cache-aware dispatch the good clients' p99 is {lpm:.1f} s with LPM locally, {dlpm:.1f} s "
    "with DLPM, {vtc:.0f} s with VTC, {fcfs:.0f} s with FCFS. There is nothing the misbehaving "
    "client takes from the others for fairness to give back, and any fair order departs from "
    "LPM's: DLPM serves a client's cache hits after the other clients' document prefills "
    "while it repays its own miss (good clients' cache hits' TTFT p50: {hit_dq:.2f} s "
    "under DoubleQ against {hit_ca:.2f} s under cache-aware). The paper names long-QA S2 "
    "DoubleQ's worst case (§6.2)"
)
TOT_S2_WHY = (
    "every client, the well-behaved ones too, is offered more than its share: all four are "
    "backlogged at once {all_backlogged:.0%} of the 300 s of arrivals, so a fair scheduler "
    "holds each to its share and the well-behaved clients' tail is their own backlog, which "
    "fairness cannot shorten; the local order then sets the tail: under the same cache-aware "
    "dispatch the good clients' p99 is {dlpm:.0f} s with DLPM (DoubleQ's), {lpm:.0f} s with "
    "LPM, {fcfs:.0f} s with FCFS, against Preble's {preble:.0f} s. A fixed Q^w of 2^23 gives "
    "{sticky:.0f} s ({sticky_gain:.2f}x lower than Preble's) by keeping the misbehaving client "
    "on the one worker caching its prefix and the well-behaved clients on the other three: "
    "Theorem A.5's unbalanced dispatch rather than the paper's even sharing (Fig. 9: every "
    "client's service spread over the 4 GPUs). DoubleQ's work-conserving spill moves a "
    "client's backlog only onto a worker that no other client is using, so it leaves this "
    "split as it is, and gives tree-of-thought S1 its throughput back. Every fixed Q^w from "
    "2,048 to 2^21 is below 1 here too (0.71-0.87x, measured 2026-12-06 without the spill)"
)
AVERAGE_WHY = {
    "p99-ca": "below 2x (per scenario in the setting column)",
    "p99-rr": "below 2x (per scenario in the setting column)",
    "mean-ca": "direction holds (>= 2x), above the paper's average, which is over 8 scenarios "
    "on up to 8 A100s: the Preble model admits from one hit-ratio group per step, as "
    "Preble's code does, so on long-QA, where the metric is TTFT, the well-behaved clients' "
    "cache hits wait for the turns of the groups of misses (whole documents), where LPM "
    "serves hits first; against cache-aware + LPM, a stronger stand-in for Preble, the "
    "average is in the setting column",
    "mean-rr": "direction holds (>= 2x), above the paper's average: round robin scatters each "
    "long-QA document over the workers, and the queues it builds grow through the whole 300 s "
    "and are served in the drain",
}


def good_p99_s(report: dict[str, Any]) -> float:
    """The largest p99 per-call latency among the well-behaved clients."""
    return max(
        float(c["latency_p99_s"])
        for n, c in report["clients"].items()
        if n.startswith("good") and c["latency_p99_s"] is not None
    )


def good_window_p99_s(sim: Any, until_s: float) -> float:
    """:func:`good_p99_s` over the calls finished by ``until_s`` only (what a run cut off
    there reports: its unfinished calls, the slowest, are left out)."""
    from fairserve.core.metrics import percentile

    by_client: dict[str, list[float]] = {}
    for r in sim.recorder.records:
        if r.client.startswith("good") and r.finish_s <= until_s:
            by_client.setdefault(r.client, []).append(r.latency_s)
    return max(percentile(latencies, 99) for latencies in by_client.values())


def window_service_per_s(sim: Any, until_s: float) -> float:
    """Service per second up to ``until_s`` (the client's view, as ``throughput``): what a
    run cut off there reports."""
    from fairserve.core.metrics import sample_at

    return sum(sample_at(sim.recorder.ledger.samples, until_s).cumulative.values()) / until_s


def good_mean_latency_s(name: str, sim: Any) -> float:
    """The paper's latency (§6.1): TTFT for long-context QA, the program's end-to-end
    completion time otherwise, averaged over the well-behaved clients' requests."""
    if name.startswith("long-qa"):
        times = [r.first_token_s - r.arrival_s for r in sim.recorder.records]
        clients = [r.client for r in sim.recorder.records]
    else:
        times = [p.completion_s for p in sim.program_records]
        clients = [p.client for p in sim.program_records]
    good = [float(t) for t, c in zip(times, clients, strict=True) if c.startswith("good")]
    return sum(good) / len(good)


def good_hit_ttft_p50_s(sim: Any) -> float:
    """Median TTFT of the well-behaved clients' cache hits (more than half the prompt
    cached): a hit's own prefill is short, so this is mostly waiting."""
    from fairserve.core.metrics import percentile

    ttfts = [
        r.ttft_s
        for r in sim.recorder.records
        if r.client.startswith("good") and r.cached_tokens > r.input_tokens / 2
    ]
    return percentile(ttfts, 50)


RULE_K = 32.0
"""``worker_quantum_requests`` of the ``doubleq-rule`` runs (the dispatcher's
``RULE_WORKER_QUANTUM_REQUESTS``): DoubleQ with ``Q^w`` = 32 of each client's mean calls,
reported beside the default (fixed ``Q^w``) in the settings."""
PAIR_PARAMS: dict[str, dict[str, Any]] = {"doubleq-rule": {"worker_quantum_requests": RULE_K}}
RULE = f"with the Q^w rule (worker_quantum_requests {RULE_K:g})"
DOUBLEQ_PAIRS = {
    "doubleq": ("dlpm", "doubleq"),
    "doubleq-rule": ("dlpm", "doubleq"),
    "preble": ("preble", "preble-e2"),
    "preble-ca": ("preble", "cache-aware"),
    "cache-aware-lpm": ("lpm", "cache-aware"),
    "rr-lpm": ("lpm", "round-robin"),
    "vtc-client-rr": ("vtc", "client-rr"),
}
"""The systems of §6: DoubleQ (at its defaults, and with the Q^w rule), the paper's Preble
(its priority-group local scheduler behind its E2 global scheduler, see PREBLE_MODEL), the
same local scheduler behind cache-aware dispatch and cache-aware + LPM (sglang-router's
rule with SGLang's default order): the earlier stand-ins for Preble, kept in the
settings), RR+LPM and VTC behind client round robin."""
PREBLE_MODEL = (
    "Preble is modelled as its local scheduler (`preble`: 10 priority groups by cache-hit "
    "ratio, group g admitting up to (g+1)·10 requests in its turn, first come first served "
    "within a group: Preble's `fcfs-mpq` defaults) behind its E2 global scheduler "
    "(`preble-e2`, from Preble's `GlobalSchedulerWithTime`): a request more than half of "
    "whose prompt was sent to a worker before goes to that worker whatever its load "
    "(exploit; as Preble's `gpu_allocations`, a placement outlives the worker's eviction "
    "of the prefix); any "
    "other goes to the worker of lowest load cost (explore), the prefill time of the "
    "requests sent to it in the last 3 minutes plus its running requests' requested output "
    "tokens times its time per output token. Estimated: prefill time from Preble's own "
    "A6000 / Mistral-7B fit (about 0.12 ms per uncached token, 24 ms at least), not from "
    "the simulated worker's profile; time per output token measured by the simulator's "
    "finished requests (median of the last 200, 0.15 s until then, as Preble's code); "
    "misses charged to the worker a request went to. Not modelled: E2's rebalancing "
    "(moving prefixes to a worker 1.5x less loaded, replicating a hot prefix whose worker's "
    "TTFT doubles). The earlier models, the same local scheduler behind `cache-aware` "
    "dispatch (sglang-router's rule: exploit only while the load is balanced) and "
    "cache-aware + LPM, are in the settings column"
)


@dataclass(frozen=True)
class DoubleQRun:
    """One system on one scenario, run until every call finished."""

    report: dict[str, Any]
    sim: Any
    mean_latency_s: float
    """The well-behaved clients' mean latency in the paper's sense."""

    @property
    def p99_s(self) -> float:
        return good_p99_s(self.report)

    @property
    def service_per_s(self) -> float:
        """All the work the scenario submits over the time it took to serve it."""
        return float(self.report["throughput"]["service_per_s"])


def doubleq_runs(
    name: str, pairs: dict[str, tuple[str, str]] | None = None, **dispatch_params: Any
) -> dict[str, DoubleQRun]:
    """Per system, the scenario run until every call finished: throughput is the same work
    over the time each system takes to serve it (the paper's Fig. 9 measures to the end of
    the last program), and latencies count every call. A run cut off at 300 s reports only
    the calls it finished, leaving out the slowest, and a throughput that depends on what
    was left queued (each system leaves a different mix: a queued cache hit carries a
    document's worth of the client's view of service); those figures are in the settings."""
    workload = builtin(name)
    runs = {}
    for key, (policy, dispatch) in (pairs or DOUBLEQ_PAIRS).items():
        report, sim = simulate(
            workload, policy, dispatch, workers=DOUBLEQ_WORKERS, profile=DOUBLEQ_PROFILE,
            drain=True, dispatch_params={**dispatch_params, **PAIR_PARAMS.get(key, {})},
        )  # fmt: skip
        runs[key] = DoubleQRun(report, sim, good_mean_latency_s(name, sim))
    return runs


def long_qa_s2_why(runs: dict[str, DoubleQRun]) -> str:
    """Why DoubleQ's good-client p99 on long-QA S2 is not below cache-aware + LPM's, with
    this checkout's measurements."""
    local = doubleq_runs(
        "long-qa-s2", {p: (p, "cache-aware") for p in ("lpm", "dlpm", "vtc", "fcfs")}
    )
    return LPM_IS_SJF.format(
        **{p: r.p99_s for p, r in local.items()},
        hit_dq=good_hit_ttft_p50_s(runs["doubleq"].sim),
        hit_ca=good_hit_ttft_p50_s(runs["cache-aware-lpm"].sim),
    )


def all_backlogged_fraction(run: DoubleQRun, until_s: float) -> float:
    """The share of the ledger's samples up to ``until_s`` in which every client waits."""
    clients = set(run.report["clients"])
    samples = [s for s in run.sim.recorder.ledger.samples if s.t_s <= until_s]
    return sum(1 for s in samples if clients <= s.backlogged) / len(samples)


def tot_s2_why(runs: dict[str, DoubleQRun]) -> str:
    """Why DoubleQ's good-client p99 on tree-of-thought S2 is not below Preble's, with this
    checkout's measurements."""
    local = doubleq_runs("tot-s2", {p: (p, "cache-aware") for p in ("dlpm", "lpm", "fcfs")})
    sticky = doubleq_runs("tot-s2", {"doubleq": ("dlpm", "doubleq")}, worker_quantum=2.0**23)
    return TOT_S2_WHY.format(
        **{p: r.p99_s for p, r in local.items()},
        all_backlogged=all_backlogged_fraction(runs["doubleq-rule"], DOUBLEQ_WINDOW_S),
        preble=runs["preble"].p99_s,
        sticky=sticky["doubleq"].p99_s,
        sticky_gain=runs["preble"].p99_s / sticky["doubleq"].p99_s,
    )


BASELINES: tuple[tuple[str | None, str, str], ...] = (
    ("Preble", "preble", "ca"),
    ("RR+LPM", "rr-lpm", "rr"),
    (None, "preble-ca", "pca"),
    (None, "cache-aware-lpm", "lpm"),
)
"""(label in the claims or None: settings only, run key, gain key)."""


def doubleq_rows() -> list[Row]:
    """DoubleQ §6 (Fig. 7), 4 workers of a10g-llama-3.2-3b (the testbed of the paper's
    Fig. 9; Fig. 7 itself ran Llama-3.1-8B on up to 8 A100s at rates it does not give). On 4
    x a100-llama-3-8b with the rates scaled to the same load (DoubleQ's busy worker-seconds
    per worker-second of arrivals) the rows do not all hold either (2026-12-06: long-QA's
    documents then fit in the cluster's KV pool and Preble keeps up; with 3.5x the
    documents, long-QA S1 is 1.89x VTC + client round robin, and tree-of-thought S1's
    throughput row holds at that load but not at 0.85 of it), so the table keeps A10G.
    DoubleQ at its defaults (the fixed Q^w and the work-conserving spill, see
    fairserve.sched.dispatch.doubleq) against the baselines on every misbehaving-client
    scenario, each run until every call finished: the issue's test (largest well-behaved
    p99 per call) per scenario, and the §6.2 averages both in that test and in the paper's
    own metric (mean TTFT for long-QA, mean program completion time for tree-of-thought and judge).
    Cache-aware + LPM and Preble's local scheduler behind cache-aware dispatch, the earlier
    models of Preble, are reported in the settings beside Preble's."""
    rows = []
    gains: dict[str, list[float]] = {
        f"{metric}-{key}{rule}": []
        for metric in ("p99", "mean")
        for _, _, key in BASELINES
        for rule in ("", "-rule")
    }
    setting = (
        f"{{}}, arrivals for {DOUBLEQ_WINDOW_S:g} s, run until every call finished, "
        f"{DOUBLEQ_WORKERS} workers, {DOUBLEQ_PROFILE}, seed 1"
    )
    for name in MISBEHAVING:
        runs = doubleq_runs(name)
        dq = runs["doubleq"]
        for _, run_key, key in BASELINES:
            for rule, system in (("", dq), ("-rule", runs["doubleq-rule"])):
                gains[f"p99-{key}{rule}"].append(runs[run_key].p99_s / system.p99_s)
                gains[f"mean-{key}{rule}"].append(
                    runs[run_key].mean_latency_s / system.mean_latency_s
                )
        where = setting.format(name)
        if name == "long-qa-s1":
            rows.extend(long_qa_s1_throughput_rows(runs, where))
        else:
            rows.append(throughput_row(name, runs, where))
        labelled = [key for base, _, key in BASELINES if base]
        default_fails = any(gains[f"p99-{key}"][-1] <= 1 for key in labelled)
        rule_fails = any(gains[f"p99-{key}-rule"][-1] <= 1 for key in labelled)
        why = tot_s2_why(runs) if name == "tot-s2" and (default_fails or rule_fails) else ""
        p99_why = why if default_fails and why else "see the setting"
        for base, run_key, key in BASELINES:
            if base is None:
                continue
            gain = gains[f"p99-{key}"][-1]
            window = good_window_p99_s(runs[run_key].sim, DOUBLEQ_WINDOW_S) / good_window_p99_s(
                dq.sim, DOUBLEQ_WINDOW_S
            )
            extra = ""
            if key == "ca":
                lpm_gain = gains["p99-lpm"][-1]
                pca_gain = gains["p99-pca"][-1]
                extra = (
                    f"; Preble behind cache-aware / DoubleQ: {pca_gain:.2f}"
                    f"; cache-aware + LPM / DoubleQ: {lpm_gain:.2f}"
                )
                if lpm_gain <= 1 and name == "long-qa-s2":
                    extra += f", below 1 because {long_qa_s2_why(runs)}"
            rule_gain = gains[f"p99-{key}-rule"][-1]
            extra += f"; {RULE}: {rule_gain:.2f}"
            if rule_gain <= 1 and why:
                extra += f", below 1 because {why}" if key == "ca" else " (see the Preble row)"
            rows.append(
                direction_row(
                    "DoubleQ", "Fig. 7", f"{name}: good clients' p99, {base} / DoubleQ (> 1)",
                    1.0, gain, gain > 1, why_not="" if gain > 1 else p99_why,
                    setting=f"{where}; {window:.2f} over the calls finished by 300 s{extra}",
                )
            )  # fmt: skip
    rows.extend(average_rows(gains, setting.format("all five scenarios")))
    return rows


def busy_seconds(report: dict[str, Any]) -> float:
    """The workers' busy time summed over the run."""
    return sum(float(w["busy_fraction"]) for w in report["workers"]) * float(report["duration_s"])


def busy_range(report: dict[str, Any]) -> tuple[float, float]:
    """The least and most busy worker's fraction of the run."""
    busy = [float(w["busy_fraction"]) for w in report["workers"]]
    return min(busy), max(busy)


def throughput_row(name: str, runs: dict[str, DoubleQRun], where: str) -> Row:
    """§6.2: DoubleQ "consistently matches or exceeds" Preble's throughput (all workloads,
    but long-QA S2 at D = 8): every call served, against Preble; when it does not hold,
    the row gives the workers' busy fractions, their busy time in all and the hit rates,
    which tell load balance (the same busy time spread over a longer run: idle workers)
    from locality (more busy time: more to compute). The other Preble models' ratios are
    in the setting."""
    dq, pb = runs["doubleq"], runs["preble"]
    ratio = dq.service_per_s / pb.service_per_s
    lpm_ratio = dq.service_per_s / runs["cache-aware-lpm"].service_per_s
    pca_ratio = dq.service_per_s / runs["preble-ca"].service_per_s
    window = window_service_per_s(dq.sim, DOUBLEQ_WINDOW_S) / window_service_per_s(
        pb.sim, DOUBLEQ_WINDOW_S
    )
    (lo, hi), (plo, phi) = busy_range(dq.report), busy_range(pb.report)
    hit, phit = dq.report["cache_hit_rate"], pb.report["cache_hit_rate"]
    busy_s, pbusy_s = busy_seconds(dq.report), busy_seconds(pb.report)
    measured = (
        f"DoubleQ's workers are busy {lo:.0%}-{hi:.0%} of the run against Preble's "
        f"{plo:.0%}-{phi:.0%} ({busy_s:,.0f} against {pbusy_s:,.0f} worker-seconds in all), "
        f"cache hit rate {hit:.3f} against {phit:.3f}"
    )
    if busy_s <= 1.05 * pbusy_s:
        cause = (
            "load balance, not locality (about the same busy time over a longer run: idle "
            "workers): a client's calls stay on the workers that cache its prefixes for up to "
            "Q^w of its service per round, and once the well-behaved clients are served the "
            "misbehaving client's backlog keeps some workers busy while others idle; "
            "Preble's exploit rule pins it too, but its explore step (prompts under half "
            "placed, such as a call after a long thought) sends the misbehaving client to "
            "the worker of lowest load cost and its prefixes follow, so all four workers "
            "come to hold them; a smaller Q^w spreads it at the cost of locality (Fig. 10's "
            "trade-off: `fairserve tune quantum --sweep --worker-grid`)"
        )
    else:
        cause = (
            "locality more than load balance: DLPM admits in fair order what Preble admits "
            "by hit-ratio group, and computes more prompt tokens (the hit rates above)"
        )
    ends = f"{dq.report['duration_s']:.0f} s against {pb.report['duration_s']:.0f} s"
    rule = runs["doubleq-rule"].service_per_s / pb.service_per_s
    if ratio < 1 and rule >= 1:
        cause += (
            f"; {RULE}, which spreads a client after about {RULE_K:g} of its calls on a worker, "
            f"this ratio is {rule:.3f}, but then tree-of-thought S2's good-client p99 rows do "
            "not hold (their settings, and the module docstring of "
            "fairserve.sched.dispatch.doubleq, give the trade-off)"
        )
    return direction_row(
        "DoubleQ", "Fig. 7", f"{name}: throughput DoubleQ / Preble, every call served "
        "(paper: matches or exceeds, >= 1)", 1.0, ratio, ratio >= 1,
        why_not=f"{measured}: {cause}",
        setting=f"{where}; all calls served in {ends}; over the first 300 s only {window:.3f}; "
        f"DoubleQ / Preble behind cache-aware: {pca_ratio:.3f}; "
        f"DoubleQ / cache-aware + LPM: {lpm_ratio:.3f}; {RULE}: {rule:.3f}",
    )  # fmt: skip


def long_qa_s1_throughput_rows(runs: dict[str, DoubleQRun], where: str) -> list[Row]:
    """Throughput against Preble and VTC + client round robin: the same work over the
    time each takes to serve it; the 300 s window's ratio beside it."""
    rows = []
    lpm_ratio = runs["doubleq"].service_per_s / runs["cache-aware-lpm"].service_per_s
    pca_ratio = runs["doubleq"].service_per_s / runs["preble-ca"].service_per_s
    for base, key, need in (
        ("Preble", "preble", 1.0),
        ("VTC+client-rr", "vtc-client-rr", 2.0),
    ):
        ratio = runs["doubleq"].service_per_s / runs[key].service_per_s
        window = window_service_per_s(runs["doubleq"].sim, DOUBLEQ_WINDOW_S) / (
            window_service_per_s(runs[key].sim, DOUBLEQ_WINDOW_S)
        )
        ends = ", ".join(f"{runs[k].report['duration_s']:.0f} s" for k in ("doubleq", key))
        extra = (
            f"; DoubleQ / Preble behind cache-aware: {pca_ratio:.3f}"
            f"; DoubleQ / cache-aware + LPM: {lpm_ratio:.3f}"
            if key == "preble"
            else ""
        )
        extra += f"; {RULE}: {runs['doubleq-rule'].service_per_s / runs[key].service_per_s:.3f}"
        rows.append(
            direction_row(
                "DoubleQ", "Fig. 7",
                f"long-QA S1 throughput DoubleQ / {base}, every call served (>= {need:g})",
                need, ratio, ratio >= need,
                why_not="" if ratio >= need else "see the setting",
                setting=f"{where}; all calls served in {ends}; over the first 300 s only "
                f"{window:.3f} (what each system left queued at 300 s differs){extra}",
            )
        )  # fmt: skip
    return rows


def average_rows(gains: dict[str, list[float]], where: str) -> list[Row]:
    """§6.2's averages. The paper's 2.90x and 4.06x are of its own latency (mean TTFT or
    program completion time): those rows must be within 15% of them; the p99 rows are the
    issue's test (at least 2x on average), which the paper states no value for. The
    Preble rows give cache-aware + LPM's averages in the setting."""
    rows = []
    for key, paper_value, label, make in (
        ("p99-ca", 2.90, "average good-client p99 gain vs Preble, >= 2", direction_row),
        ("p99-rr", 4.06, "average good-client p99 gain vs RR+LPM, >= 2", direction_row),
        (
            "mean-ca",
            2.90,
            "average good-client mean latency gain vs Preble (paper's metric)",
            ratio_row,
        ),
        (
            "mean-rr",
            4.06,
            "average good-client mean latency gain vs RR+LPM (paper's metric)",
            ratio_row,
        ),
    ):
        gain = sum(gains[key]) / len(gains[key])
        per = ", ".join(f"{g:.2f}" for g in gains[key])
        rule = gains[f"{key}-rule"]
        extra = f"; {RULE}: {sum(rule) / len(rule):.2f} (per scenario "
        extra += ", ".join(f"{g:.2f}" for g in rule) + ")"
        if key.endswith("-ca"):
            extra += "".join(
                f"; against {label} {sum(g) / len(g):.2f} "
                f"(per scenario {', '.join(f'{x:.2f}' for x in g)})"
                for label, g in (
                    ("Preble behind cache-aware", gains[key.replace("-ca", "-pca")]),
                    ("cache-aware + LPM", gains[key.replace("-ca", "-lpm")]),
                )
            )
        row = make(
            "DoubleQ",
            "§6.2",
            label,
            paper_value,
            gain,
            gain >= 2,
            setting=f"{where}; per scenario {per}{extra}",
        )
        if not row.holds:
            why = AVERAGE_WHY[key]
            rule_gain = sum(rule) / len(rule)
            if make is ratio_row and abs(rule_gain / paper_value - 1) <= RATIO_TOLERANCE:
                why += (
                    f"; {RULE} it is {rule_gain:.2f}, within 15% of the paper's: the rest of "
                    "the excess is the fixed Q^w keeping the misbehaving client on the workers "
                    "caching its prefixes, away from the well-behaved clients (its spill "
                    "shares only the workers that no other client is using)"
                )
            row = dataclasses.replace(row, why_not=why)
        rows.append(row)
    return rows  # fmt: skip


# ------------------------------------------------------------------ table

CHECKS: dict[str, Callable[[], list[Row]]] = {
    "vtc": vtc_rows,
    "vtc-paper": vtc_paper_rows,
    "throughput-optimal": stability_rows,
    "throughput-optimal-served": served_rows,
    "justitia": justitia_rows,
    "justitia-intensity": justitia_intensity_rows,
    "dlpm": dlpm_rows,
    "doubleq": doubleq_rows,
}
FAST = ("vtc", "throughput-optimal", "throughput-optimal-served", "justitia")
"""What CI regenerates on every run (the rest takes minutes on 2 cores)."""


def rows_for(names: tuple[str, ...]) -> list[Row]:
    rows: list[Row] = []
    for name in names:
        rows.extend(CHECKS[name]())
    return rows


DOUBLEQ_HARDWARE = (
    "Hardware: Fig. 7 ran Llama-3.1-8B on up to 8 A100s at rates the paper does not give,"
    " so the rows run on 4 workers of its Fig. 9 testbed (a10g-llama-3.2-3b). On 4 x "
    "a100-llama-3-8b with each scenario's rates scaled to the same busy worker-seconds "
    "(long-QA S1 x9, S2 x11, tree-of-thought S1 x2.17, S2 x2.5, judge x2.58; measured "
    "2026-12-06) DoubleQ at its defaults gives throughput against Preble 0.94, 0.92, "
    "1.38, 1.33, 1.13 and good-client p99 gains 1.18, 0.73, 4.33, 1.07, 1.09: there the "
    "long-QA throughput rows and long-QA S2's p99 do not hold (at those rates the "
    "documents fit in the cluster's KV pool and Preble keeps up), with or without "
    "DoubleQ's spill"
)
"""What the table's GPU choice leaves out (printed below the table)."""

NOTES = {"DoubleQ": f"{PREBLE_MODEL}. {DOUBLEQ_HARDWARE}"}
"""Per paper, how its baselines are modelled (printed below the table)."""


def _number(value: float) -> str:
    if value != value:  # NaN
        return "-"
    return f"{value:.3g}"


def _machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"


def _row_line(r: Row) -> str:
    verdict = "yes" if r.holds else f"no: {r.why_not or 'see the setting'}"
    ratio = _number(r.ratio) if r.exact else "-"
    return (
        f"| {r.paper} | {r.figure} | {r.claim} | {_number(r.paper_value)} | "
        f"{_number(r.ours)} | {ratio} | {verdict} | {r.setting} |"
    )


def _document(generated: str, row_lines: list[str]) -> str:
    """The whole file: ``generated`` (what made it, when, where), the rows, the notes of
    the papers they name."""
    lines = [
        "# Paper results against the simulator",
        "",
        f"{generated} ({_machine()}; no GPU:",
        "every number is the simulator's). Seeds: every workload's own (`seed = 1`); runs are",
        "deterministic. *holds*: same direction as the paper, and within 15% of its value where",
        "the paper states a value as its finding (ratio column); otherwise the row says why not.",
        "",
        "| paper | figure | result | paper | ours | ratio | holds? | setting |",
        "|---|---|---|---|---|---|---|---|",
        *row_lines,
    ]
    papers = {_paper_of_line(line) for line in row_lines}
    notes = [f"**{paper}.** {note}." for paper, note in NOTES.items() if paper in papers]
    if notes:
        lines += ["", "## How the baselines are modelled", "", *notes]
    return "\n".join(lines) + "\n"


def markdown(rows: list[Row], command: str) -> str:
    today = datetime.date.today().isoformat()
    return _document(f"Generated by `{command}` on {today}", [_row_line(r) for r in rows])


PAPER_OF_CHECK = {
    "vtc": "VTC",
    "vtc-paper": "VTC",
    "throughput-optimal": "Throughput-optimal",
    "throughput-optimal-served": "Throughput-optimal",
    "justitia": "Justitia",
    "justitia-intensity": "Justitia",
    "dlpm": "DLPM",
    "doubleq": "DoubleQ",
}
"""The paper whose rows each check writes (several checks may share one paper)."""
FIRST_GENERATED = re.compile(r"Generated by `python scripts/paper_table\.py` on (\d{4}-\d\d-\d\d)")


def _paper_of_line(line: str) -> str:
    return line.split("|")[1].strip()


def _claim_of_line(line: str) -> str:
    return line.split("|")[3].strip()


def merge(existing: str, rows: list[Row], names: tuple[str, ...], command: str) -> str:
    """``existing`` (the committed table) with the rows of the checks ``names`` replaced,
    every other paper's rows kept as they are, so that regenerating one paper (``--only``)
    or the CI subset (``--fast``) does not drop the rest. A paper all of whose checks ran
    has its rows replaced as a block, where they stood; a paper of which only some checks
    ran has the rows with the same claim replaced in place and new claims added after its
    last row. The header keeps the full run's date and names what was regenerated since."""
    table = [line for line in existing.splitlines() if line.startswith("| ")][1:]  # no header
    whole = {
        paper
        for paper in {PAPER_OF_CHECK[n] for n in names}
        if all(n in names for n, p in PAPER_OF_CHECK.items() if p == paper)
    }
    new_lines = {(r.paper, r.claim): _row_line(r) for r in rows}
    out: list[str] = []
    placed: set[tuple[str, str]] = set()
    for line in table:
        paper, claim = _paper_of_line(line), _claim_of_line(line)
        if paper in whole:
            if not any(k[0] == paper for k in placed):
                block = [k for k in new_lines if k[0] == paper]
                out += [new_lines[k] for k in block]
                placed.update(block)
            continue
        key = (paper, claim)
        if key in new_lines:
            placed.add(key)
        out.append(new_lines.get(key, line))
    for key, line in new_lines.items():  # claims the table did not have yet
        if key not in placed:
            last = max(
                (i for i, old in enumerate(out) if _paper_of_line(old) == key[0]), default=-1
            )
            out.insert(last + 1 if last >= 0 else len(out), line)
            placed.add(key)
    first = FIRST_GENERATED.search(existing)
    since = first.group(1) if first else "an earlier date"
    papers = ", ".join(sorted({r.paper for r in rows}))
    today = datetime.date.today().isoformat()
    generated = (
        f"Generated by `python scripts/paper_table.py` on {since}, its {papers} rows again "
        f"(`{command}`) on {today}"
    )
    return _document(generated, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--fast", action="store_true", help="only the rows CI runs")
    parser.add_argument("--only", choices=sorted(CHECKS), action="append", help="these papers")
    parser.add_argument("--out", default=str(OUT), help="file to write, or - for stdout")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "cli"))  # this checkout's fairserve
    names = tuple(args.only) if args.only else FAST if args.fast else tuple(CHECKS)
    rows = rows_for(names)
    command = "python scripts/paper_table.py" + (" --fast" if args.fast else "")
    command += "".join(f" --only {n}" for n in args.only or ())
    out = Path(args.out)
    if args.out != "-" and names != tuple(CHECKS) and out.exists():
        text = merge(out.read_text(encoding="utf-8"), rows, names, command)
    else:
        text = markdown(rows, command)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        out.write_text(text, encoding="utf-8")
    failing = [r for r in rows if not r.holds and not r.why_not]
    for r in failing:
        print(f"does not hold: {r.paper} {r.figure} {r.claim}", file=sys.stderr)
    return 1 if failing else 0


if __name__ == "__main__":
    raise SystemExit(main())
