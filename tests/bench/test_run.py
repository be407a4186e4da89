"""The bench against a real simulated worker: report, closed loop, identity, prefix cache.

Runs are about a second of traffic against a worker 50× faster than real time, so the
worker is never the bottleneck and every call finishes well inside the run.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from fairserve.bench import Api, BenchOptions, BenchResult, bench_report, run_workload
from fairserve.workloads import Workload
from tests.bench.helpers import multi_turn, single, worker, workload
from tests.cli.test_simulate import CLIENT_KEYS as REPORT_CLIENT_KEYS
from tests.worker.helpers import get_json, run

# The report's per-client keys are simulate's (one DESIGN §7 report), plus what only a real
# run has: errors and calls left unfinished.
CLIENT_KEYS = REPORT_CLIENT_KEYS | {"errors", "unfinished"}


async def bench_worker(
    load: Workload, api: Api = "completions", **config: Any
) -> tuple[BenchResult, dict[str, Any]]:
    """Run ``load`` against a fresh worker; the result and the worker's state after it."""
    async with worker(**config) as (_, url):
        result = await run_workload(url, load, BenchOptions(api=api, timeout_s=5))
        async with aiohttp.ClientSession(base_url=url) as session:
            _, state = await get_json(session, "/fairserve/worker/state")
    return result, state


def test_report_has_the_design_keys_and_sane_values() -> None:
    load = workload(single("alice", 8) + single("bob", 4, inputs=40))
    result, _ = run(bench_worker(load))
    report = bench_report(result)
    for key in ("throughput", "cache_hit_rate", "jain_index", "max_service_gap", "errors"):
        assert key in report
    assert set(report["throughput"]) == {"tokens_per_s", "service_per_s", "requests_per_s"}
    assert report["errors"]["total"] == 0
    assert 0.9 <= report["duration_s"] < 3.0
    clients = report["clients"]
    assert set(clients) == {"alice", "bob"}
    for name, expected in (("alice", 8), ("bob", 4)):
        entry = clients[name]
        assert set(entry) >= CLIENT_KEYS
        assert entry["requests"] == expected  # uniform arrivals over 1 s
        assert 0 < entry["ttft_p50_s"] <= entry["latency_p50_s"] <= entry["latency_p99_s"] < 1
        # service = prompt + 2 × output, every call of 8 output tokens
        prompt = 20 if name == "alice" else 40
        assert entry["service"] == pytest.approx(expected * (prompt + 2 * 8))
    assert report["throughput"]["requests_per_s"] == pytest.approx(12 / report["duration_s"])
    assert 0.5 < report["jain_index"] <= 1.0
    assert report["workers"][0]["requests"] == 12


@pytest.mark.parametrize("api", ["completions", "chat", "generate"])
def test_closed_loop_children_follow_parents_and_reuse_their_real_answers(api: Api) -> None:
    load = workload(multi_turn("alice", 3, turns=3))
    result, _ = run(bench_worker(load, api))
    by_id = {a.call_id: a for a in result.attempts}
    children = 0
    for attempt in result.attempts:
        assert attempt.ok, attempt
        call = next(c for c in result.programs[attempt.app].calls if c.id == attempt.call_id)
        for parent_id in call.after:
            parent = by_id[parent_id]
            assert parent.finish_s is not None and attempt.sent_s is not None
            assert attempt.arrival_s >= parent.finish_s
            assert attempt.sent_s >= parent.finish_s
            # The engine cached the parent's prompt and answer; the child quotes the answer
            # the server gave, so all of it is a cache hit.
            assert attempt.cached_tokens >= parent.prompt_tokens + parent.completion_tokens
            children += 1
    assert children >= 4  # 3 programs × 2 follow-up turns, minus any cut by the end


def test_each_client_identity_reaches_the_worker() -> None:
    load = workload(single("alice", 5) + single("bob", 5))
    _, state = run(bench_worker(load, policy="vtc"))
    assert set(state["policy"]["clients"]) == {"alice", "bob"}


def test_shared_prefixes_hit_the_prefix_cache() -> None:
    load = workload(single("alice", 10, prefix=400, inputs=10))
    result, _ = run(bench_worker(load))
    report = bench_report(result)
    # every call after the first one shares 400 of its 410 prompt tokens
    assert report["cache_hit_rate"] > 0.8
    assert report["workers"][0]["cache_hit_rate"] == report["cache_hit_rate"]
