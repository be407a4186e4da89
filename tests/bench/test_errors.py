"""Failures are counted, never dropped: refused calls by status and client, hanging calls
as timeouts or unfinished, a missing server as :class:`Unreachable`; identities and keys
reach the upstream."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fairserve.bench import BenchOptions, Unreachable, bench_report, run_workload
from fairserve.core.errors import ConfigError
from tests.bench.helpers import HANGING, scripted_upstream, single, workload
from tests.worker.helpers import run
from tests.worker.processes import free_port


def test_refusals_are_counted_per_client_and_status() -> None:
    load = workload(single("alice", 5) + single("bob", 4) + single("carol", 3))

    async def body() -> tuple[dict[str, Any], list[dict[str, str]]]:
        async with scripted_upstream() as upstream:
            options = BenchOptions(timeout_s=2, token="k-123")
            result = await run_workload(upstream.url + "/v1/", load, options)
            return bench_report(result), upstream.headers

    report, headers = run(body())
    errors = report["errors"]
    assert errors["by_client"] == {"bob": {"http_429": 4}, "carol": {"http_500": 3}}
    assert errors["by_status"] == {"http_429": 4, "http_500": 3} and errors["total"] == 7
    clients = report["clients"]
    assert clients["alice"]["requests"] == 5 and clients["alice"]["errors"] == {}
    assert clients["bob"]["requests"] == 0 and clients["bob"]["rejected"] == 4
    assert clients["alice"]["service"] == pytest.approx(5 * (5 + 2 * 3))  # the usage sent
    assert len(headers) == 12
    for seen in headers:
        client, app = seen["X-Fairserve-Client"], seen["X-Fairserve-App"]
        assert client in {"alice", "bob", "carol"} and app.startswith(client + "/p")
        assert seen["Authorization"] == "Bearer k-123"


def test_a_hanging_upstream_ends_the_run_on_time_and_counts_the_calls() -> None:
    load = workload(single("alice", 4) + single(HANGING, 4), duration_s=0.5)

    async def body() -> dict[str, Any]:
        async with scripted_upstream() as upstream:
            result = await run_workload(upstream.url, load, BenchOptions(timeout_s=0.4))
            return bench_report(result)

    started = time.monotonic()
    report = run(body())
    assert time.monotonic() - started < 2.5  # 0.5 s of traffic + 0.4 s of grace
    slow = report["errors"]["by_client"][HANGING]
    assert sum(slow.values()) == 2 and set(slow) <= {"timeout", "unfinished"}
    assert report["clients"]["alice"]["requests"] == 2


def test_unreachable_url_raises_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(Unreachable, match=f"cannot reach {url}"):
        run(run_workload(url, workload(single("alice", 2)), BenchOptions(timeout_s=1)))


def test_bad_url_and_options_are_config_errors() -> None:
    load = workload(single("alice", 2))
    with pytest.raises(ConfigError, match="--url"):
        run(run_workload("localhost:8000", load, BenchOptions()))
    with pytest.raises(ConfigError, match="--max-in-flight"):
        run(run_workload("http://127.0.0.1:1", load, BenchOptions(max_in_flight=0)))
