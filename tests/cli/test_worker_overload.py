"""Under overload the simulated worker keeps finishing requests at capacity, as SGLang does.

Before, the worker admitted everything its KV pool held: at 4x overload the running batch
grew without bound, every decode step got slower, and for the length of a benchmark almost
nothing finished (``max_running_requests = 233645``). Now it bounds the running batch
(:func:`fairserve.sim.running_bound.default_running_requests`) and the rest waits, so requests
finish one bounded-batch latency after the overload starts and then at the rate of a full
batch. The test runs the real ``fairserve worker`` and an open-loop client at 4x that rate,
and reads the worker's own counters (finished requests, simulated time) so that a slow
test machine cannot pass for a slow worker.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fairserve.sim.profile import profile_from_toml
from fairserve.sim.running_bound import default_running_requests as max_running_requests
from tests.cli.conftest import RunCli
from tests.fakes.profiles import synthetic_profile_toml
from tests.worker.processes import free_port, wait_http_ok

# Slow steps (0.1 s + 2 ms per token beyond 8) and a KV pool far larger than the batch
# needs: an unbounded worker would admit every arrival.
SLOW_PROFILE = synthetic_profile_toml(
    provenance="slow profile for the overload test",
    c_s=0.1,
    a_s_per_token=0.002,
    b0_tokens=8,
    kv_capacity_tokens=1000000,
    max_batch_tokens=256,
)
PROMPT_TOKENS = 8
OUTPUT_TOKENS = 32
OVERLOAD = 4.0
DURATION_S = 16.0


@pytest.fixture
def worker_url(fairserve_exe: Path, tmp_path: Path) -> Iterator[str]:
    profile = tmp_path / "slow.toml"
    profile.write_text(SLOW_PROFILE, encoding="utf-8")
    port = free_port()
    proc = subprocess.Popen(
        [str(fairserve_exe), "worker", "--port", str(port), "--profile", str(profile)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(url + "/health")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def _state(session: aiohttp.ClientSession) -> dict[str, Any]:
    async with session.get("/fairserve/worker/state") as resp:
        data: dict[str, Any] = await resp.json()
        return data


async def _overload(url: str, rate_per_s: float) -> dict[str, Any]:
    """Send ``rate_per_s`` requests per second for DURATION_S; the worker's state then."""
    rng = random.Random(7)
    timeout = aiohttp.ClientTimeout(total=DURATION_S + 30)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(url, timeout=timeout, connector=connector) as session:

        async def one() -> None:
            body = {
                "input_ids": [rng.randrange(1000, 30000) for _ in range(PROMPT_TOKENS)],
                "sampling_params": {"max_new_tokens": OUTPUT_TOKENS},
            }
            async with session.post("/generate", json=body) as resp:
                await resp.read()

        tasks: list[asyncio.Task[None]] = []
        started = time.monotonic()
        for i in range(int(rate_per_s * DURATION_S)):
            await asyncio.sleep(max(0.0, started + i / rate_per_s - time.monotonic()))
            tasks.append(asyncio.create_task(one()))
        end = await _state(session)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return end


@pytest.mark.slow
def test_worker_finishes_at_capacity_under_4x_overload(worker_url: str) -> None:
    profile = profile_from_toml(SLOW_PROFILE, name="slow")
    cap = max_running_requests(profile)
    full_step_s = profile.batch_time().batch_time_s(cap, 0)
    # A full batch decodes ``cap`` tokens per step; a request also costs its prompt tokens.
    capacity_req_s = cap / full_step_s / (PROMPT_TOKENS + OUTPUT_TOKENS)
    latency_s = OUTPUT_TOKENS * full_step_s
    end = asyncio.run(_overload(worker_url, OVERLOAD * capacity_req_s))

    assert end["running"] <= cap and end["waiting"] > 0  # overloaded, the batch bounded
    expected = capacity_req_s * (end["virtual_time_s"] - latency_s)
    assert end["engine"]["finished"] >= 0.7 * expected, (expected, end)


def test_max_running_requests_option_sets_the_bound(fairserve_exe: Path) -> None:
    from tests.worker.processes import http_json, read_ready_url, spawn

    worker = spawn([str(fairserve_exe), "worker", "--port", "0", "--max-running-requests", "7"])
    try:
        url = read_ready_url(worker)
        status, info = http_json(url + "/get_server_info")
        assert status == 200 and info["max_running_requests"] == 7
    finally:
        worker.terminate()
        worker.wait(timeout=10)


def test_max_running_requests_below_one_is_a_usage_error(run_cli: RunCli) -> None:
    result = run_cli("worker", "--max-running-requests", "0")
    assert result.returncode == 2 and "--max-running-requests" in result.stderr
