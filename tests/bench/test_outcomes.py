"""A run where nothing failed reports no errors: calls still open when the run ended are
``unfinished`` (with what ``--duration`` and ``--timeout`` mean), calls waiting for an unsent
call are ``skipped``; each client has its own in-flight limit, so one client's backlog
cannot take another's slots; Jain's index is weighted with the router's weights."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fairserve.bench import BenchOptions, BenchResult, bench_report, run_workload
from fairserve.bench.runner import SKIP_UNSENT
from fairserve.core.types import tokens_to_key
from fairserve.workloads import ClientInfo
from fairserve.workloads.model import Call, Program
from tests.bench.helpers import HANGING, scripted_upstream, single, worker, workload
from tests.bench.test_report import attempt, result
from tests.worker.helpers import run


def test_calls_open_at_the_end_are_unfinished_not_errors() -> None:
    # 200 tokens at 0.02 simulated s each, in real time: 4 s per answer, streaming all along.
    load = workload(single("alice", 10, out=200), duration_s=0.3)

    async def body() -> dict[str, Any]:
        async with worker(speed=1.0) as (_, url):
            options = BenchOptions(timeout_s=0.5, api="generate")
            return bench_report(await run_workload(url, load, options))

    report = run(body())
    assert report["errors"] == {"total": 0, "by_status": {}, "by_client": {}}
    unfinished = report["unfinished"]
    assert unfinished["total"] == 3 and unfinished["by_client"] == {"alice": 3}
    (reason,) = unfinished["reasons"]
    assert "arrivals stopped at 0.3 s (--duration)" in reason and "0.5 s (--timeout)" in reason
    assert report["clients"]["alice"]["errors"] == {}
    assert report["clients"]["alice"]["unfinished"] == 3
    assert report["target_duration_s"] == 0.3 and report["drain_timeout_s"] == 0.5


@dataclass(frozen=True)
class _Chain:
    """One program of three calls in a chain, the second due long after the run ends."""

    name: str = "chain"
    description: str = "a chain of three calls"
    duration_s: float = 0.3
    seed: int = 1
    clients: tuple[ClientInfo, ...] = (ClientInfo("alice"),)

    def programs(
        self, seed: int | None = None, duration_s: float | None = None
    ) -> Iterator[Program]:
        key = tokens_to_key(range(100, 110))
        calls = (
            Call("alice/p0/c0", key, 3, 3),
            Call("alice/p0/c1", key, 3, 3, after=("alice/p0/c0",), delay_s=5.0),
            Call("alice/p0/c2", key, 3, 3, after=("alice/p0/c1",)),
        )
        yield Program("alice/p0", "alice", "chain", 0.0, calls)


def test_dependants_of_unsent_calls_are_skipped_not_errors() -> None:
    async def body() -> dict[str, Any]:
        async with scripted_upstream() as upstream:
            return bench_report(await run_workload(upstream.url, _Chain(), BenchOptions()))

    report = run(body())
    assert report["errors"]["total"] == 0
    assert report["skipped"] == {
        "total": 1, "by_client": {"alice": 1}, "reasons": {SKIP_UNSENT: 1},
    }  # fmt: skip
    alice = report["clients"]["alice"]
    assert (alice["requests"], alice["unsent"], alice["skipped"]) == (1, 1, 1)
    assert alice["rejected"] == 0


def test_in_flight_limit_is_per_client() -> None:
    # With one shared slot the hanging client's first call would hold it and alice could
    # send nothing; per client, alice's calls all go through.
    load = workload(single(HANGING, 20) + single("alice", 10), duration_s=0.5)

    async def body() -> dict[str, Any]:
        async with scripted_upstream() as upstream:
            options = BenchOptions(timeout_s=1.0, max_in_flight=1)
            return bench_report(await run_workload(upstream.url, load, options))

    report = run(body())
    assert report["clients"]["alice"]["requests"] == 5
    assert report["clients"]["alice"]["errors"] == {}


def test_jain_is_weighted_with_the_routers_weights() -> None:
    # b gets twice a's service: equal to Jain 1 with b's weight 2, well below with weight 1.
    attempts = [attempt("a", 0.0, 0.5, 1.0), attempt("b", 0.0, 0.5, 1.0),
                attempt("b", 0.0, 0.5, 1.0)]  # fmt: skip
    clients = (ClientInfo("a"), ClientInfo("b"))
    plain = BenchResult("http://x", "chat", "w", 1, 4.0, 4.0, clients, attempts, {}, {})
    weighted = BenchResult("http://x", "chat", "w", 1, 4.0, 4.0, clients, attempts, {}, {},
                           server_weights={"a": 1.0, "b": 2.0})  # fmt: skip
    assert bench_report(plain)["jain_index"] < 0.95
    report = bench_report(weighted)
    assert report["jain_index"] == 1.0
    assert report["jain_weighted"] is True and report["jain_weights"] == "router"
    assert report["clients"]["b"]["weight"] == 2.0
    assert bench_report(result(attempts))["jain_weights"] == "workload"


def test_per_client_rates_are_over_the_window_where_all_are_active() -> None:
    # Over the whole run the drain serves a's backlog alone and its rate looks twice b's;
    # inside the window both got the same, which is what a fair split means.
    attempts = [attempt("a", 0.0, 0.5, 1.0), attempt("b", 0.0, 0.5, 1.0),
                attempt("a", 3.5, 3.6, 3.9), attempt("b", 2.0, 2.5, 2.9)]  # fmt: skip
    report = bench_report(result(attempts))
    assert report["jain_window_s"] == [0.0, 2.0]
    a, b = report["clients"]["a"], report["clients"]["b"]
    assert a["window_service_rate"] == b["window_service_rate"] == (10 + 2 * 5) / 2.0
