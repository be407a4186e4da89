"""The client-side report built from hand-made attempts: service on the grid, backlog,
errors and unfinished calls, through the simulator's ``build_report``."""

from __future__ import annotations

import pytest

from fairserve.bench import BenchResult, bench_report, to_sim_result
from fairserve.bench.client import OK, UNFINISHED, Attempt
from fairserve.workloads import ClientInfo


def attempt(
    client: str, arrival_s: float, first_s: float, finish_s: float, **kw: object
) -> Attempt:
    done = Attempt(client, f"{client}/p0", f"{client}/p0/c{arrival_s}", arrival_s, 10)
    done.sent_s, done.first_token_s, done.finish_s = arrival_s, first_s, finish_s
    done.prompt_tokens, done.completion_tokens, done.status = 10, 5, OK
    for name, value in kw.items():
        setattr(done, name, value)
    return done


def result(attempts: list[Attempt]) -> BenchResult:
    clients = (ClientInfo("a"), ClientInfo("b", 2.0))
    return BenchResult("http://x", "chat", "w", 1, 4.0, 4.0, clients, attempts, {"b": 1}, {})


def test_service_backlog_errors_and_unfinished() -> None:
    hanging = attempt("b", 3.5, 3.9, 3.9, status=UNFINISHED, prompt_tokens=0)
    hanging.first_token_s = hanging.finish_s = None
    attempts = [
        attempt("a", 0.0, 0.5, 2.0, cached_tokens=4),
        attempt("a", 2.0, 2.5, 3.0),
        attempt("b", 0.0, 3.0, 3.5),  # b waits 3 s: a gets service while both wait
        attempt("b", 1.0, 1.0, 1.0, status="http_429", prompt_tokens=0, completion_tokens=0),
        hanging,
    ]
    sim = to_sim_result(result(attempts))
    assert sim.service == {"a": 2 * (10 + 2 * 5), "b": 10 + 2 * 5}
    assert sim.unfinished == {"b": 1}
    assert sim.samples[0].backlogged == frozenset({"a", "b"})
    report = bench_report(result(attempts))
    # Both backlogged over [0, 3): a's service up to just before 3.0 (its last output piece
    # and b's prompt land at 3.0): 20 + 10 + 4 × 2.
    assert report["max_service_gap"] == pytest.approx(38)
    assert report["cache_hit_rate"] == pytest.approx(4 / 30)
    # Still open at the end is not an error: counted apart, with the reason.
    assert report["errors"]["by_client"] == {"b": {"http_429": 1}}
    assert report["unfinished"]["by_client"] == {"b": 1}
    b = report["clients"]["b"]
    assert (b["requests"], b["rejected"], b["unfinished"], b["unsent"]) == (1, 1, 1, 1)
    assert b["weight"] == 2.0 and b["latency_p50_s"] == pytest.approx(3.5)
    assert report["clients"]["a"]["ttft_p99_s"] == pytest.approx(0.5, abs=0.01)
