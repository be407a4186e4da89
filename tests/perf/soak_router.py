"""Soak and overload isolation of a real router in front of real simulated workers.

Starts ``fairserve worker`` processes and a ``fairserve router`` process (the default
launch's settings unless told otherwise), then offers open-loop Poisson traffic from
*heavy* and *light* clients for ``--duration`` seconds, and reports:

* the router's RSS, open file descriptors and requests held (``active_requests``) sampled
  every ``--sample-s`` seconds, with their least-squares slope after ``--warmup-s`` (flat
  is the goal: MiB/min and fds/min), and the RSS per request held (KiB): under open-loop
  overload the router holds every request the per-client cap (``--queue-cap``) lets in,
  so its memory follows that backlog;
* per class (heavy, light): requests offered, answered, refused with a clear status (429,
  503, 502, 400) and lost (no answer, or a transport error), latency p50/p99;
* with ``--baseline``: the light clients alone first, so the light p99 under overload can
  be compared with it (issue 18: within 2x).

Every loop is bounded in count and time. Example (the issue's 10-minute soak at ~2x)::

    python tests/perf/soak_router.py --duration 600 --heavy 10 --light 40 --overload 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import psutil

from tests.worker.processes import free_port, read_ready_url, spawn, worker_command

PROMPT_WORDS = 120
OUTPUT_TOKENS = 32
CLIENT_TIMEOUT_S = 300.0
"""A request without an answer by then is lost (the router's own bounds answer sooner: a
slot within --queue-timeout, a streamed first byte within --first-byte-timeout)."""
MAX_OUTSTANDING = 4000
"""The load generator never keeps more open requests than this (its own bound)."""


@dataclass
class ClassStats:
    offered: int = 0
    answered: int = 0
    refused: dict[int, int] = field(default_factory=dict)
    lost: int = 0
    skipped: int = 0
    latencies_s: list[float] = field(default_factory=list)
    answered_at_s: list[float] = field(default_factory=list)
    """When each answer arrived (monotonic): throughput is read inside the offered window."""

    def answered_between(self, start_s: float, end_s: float) -> int:
        return sum(1 for t in self.answered_at_s if start_s <= t <= end_s)

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_s)
        return {
            "offered": self.offered,
            "answered": self.answered,
            "refused": {str(k): v for k, v in sorted(self.refused.items())},
            "lost": self.lost,
            "skipped_by_generator": self.skipped,
            "latency_p50_s": _pct(lat, 50),
            "latency_p99_s": _pct(lat, 99),
        }


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    return xs[min(len(xs) - 1, math.ceil(q / 100 * len(xs)) - 1)]


@contextmanager
def cluster(args: argparse.Namespace) -> Iterator[tuple[str, psutil.Process]]:
    procs: list[subprocess.Popen[str]] = []
    try:
        urls = []
        for _ in range(args.workers):
            port = free_port()
            proc = spawn(
                worker_command("--port", str(port), "--speed", str(args.speed), *args.worker_arg)
            )
            procs.append(proc)
            urls.append(read_ready_url(proc))
        port = free_port()
        argv = [sys.executable, "-m", "fairserve", "router", "--port", str(port)]
        for url in urls:
            argv += ["--worker-url", url]
        router = spawn(argv + args.router_args)
        procs.append(router)
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, 30.0)
        yield url, psutil.Process(router.pid)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_healthy(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"router at {url} not healthy within {timeout_s}s")


def reported_capacity_req_per_s(url: str, speed: float) -> float:
    """Requests/s the workers' profiles promise at this request size: their peak (every step
    at the full token budget) times ``speed``. Only an upper bound: decode steps of a
    bounded running batch carry far fewer tokens, so a soak sized by it overloads several
    times more than it says (the reason :func:`measured_capacity_req_per_s` exists)."""
    with urllib.request.urlopen(url + "/fairserve/v1/state?limit=1", timeout=5) as resp:
        state = json.loads(resp.read())
    tokens_per_s = sum(w.get("capacity_tokens_per_s") or 0.0 for w in state["workers"])
    if tokens_per_s <= 0:
        raise SystemExit("the workers report no capacity; give --rate instead")
    return speed * tokens_per_s / (PROMPT_WORDS + OUTPUT_TOKENS)


def running_bounds(url: str) -> list[int]:
    """Each worker's running bound (``max_running_requests`` of ``/get_server_info``)."""
    with urllib.request.urlopen(url + "/fairserve/v1/state?limit=1", timeout=5) as resp:
        state = json.loads(resp.read())
    bounds = []
    for worker in state["workers"]:
        with urllib.request.urlopen(worker["url"] + "/get_server_info", timeout=5) as resp:
            bounds.append(int(json.loads(resp.read())["max_running_requests"]))
    return bounds


async def measured_capacity_req_per_s(url: str, seconds: float, concurrency: int) -> float:
    """Requests/s the cluster finishes when saturated: ``concurrency`` closed-loop senders of
    the soak's request shape for ``seconds``, counted after the first third (the batch
    fills); senders still waiting at the end are cancelled (their requests aborted). What
    "2x capacity" is measured against. Saturated means every worker's running batch full:
    by default 1.25x the sum of their running bounds (64 senders, 32 a worker, measured
    a batch of 32 against a bound of 259, and called that capacity)."""
    connector = aiohttp.TCPConnector(limit=0)
    started = time.monotonic()
    count_from, end = started + seconds / 3, started + seconds
    finished: list[float] = []
    async with aiohttp.ClientSession(base_url=url, connector=connector) as s:

        async def sender(index: int) -> None:
            n = 0
            while True:
                n += 1
                content = f"calibrate-{index} {n} " + "word " * PROMPT_WORDS
                body = {"messages": [{"role": "user", "content": content}],
                        "max_tokens": OUTPUT_TOKENS}  # fmt: skip
                headers = {"X-Fairserve-Client": f"calibrate-{index % 8}"}
                async with s.post("/v1/chat/completions", json=body, headers=headers) as resp:
                    await resp.read()
                    if resp.status == 200:
                        finished.append(time.monotonic())

        senders = [asyncio.create_task(sender(i)) for i in range(concurrency)]
        await asyncio.sleep(seconds)
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
    counted = [t for t in finished if count_from <= t <= end]
    if not counted:
        raise SystemExit("calibration finished no request; give --rate instead")
    return len(counted) / (end - count_from)


async def offer(
    url: str, clients: list[tuple[str, str, float]], duration_s: float
) -> dict[str, ClassStats]:
    """Poisson arrivals per client until ``duration_s``; then wait for the answers (bounded
    by the session timeout)."""
    stats = {kind: ClassStats() for _, kind, _ in clients}
    open_requests: set[asyncio.Task[None]] = set()
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(base_url=url, timeout=timeout, connector=connector) as s:

        async def one(name: str, kind: str, n: int) -> None:
            body = {
                "messages": [{"role": "user", "content": f"{name} {n} " + "word " * PROMPT_WORDS}],
                "max_tokens": OUTPUT_TOKENS,
            }
            started = time.monotonic()
            try:
                headers = {"X-Fairserve-Client": name}
                async with s.post("/v1/chat/completions", json=body, headers=headers) as resp:
                    await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError, OSError):
                stats[kind].lost += 1
                return
            if status == 200:
                stats[kind].answered += 1
                now = time.monotonic()
                stats[kind].latencies_s.append(now - started)
                stats[kind].answered_at_s.append(now)
            else:
                stats[kind].refused[status] = stats[kind].refused.get(status, 0) + 1

        async def client(name: str, kind: str, rate: float, seed: int) -> None:
            rng = random.Random(seed)
            end = time.monotonic() + duration_s
            n = 0
            while True:
                await asyncio.sleep(rng.expovariate(rate))
                if time.monotonic() >= end:
                    return
                n += 1
                stats[kind].offered += 1
                if len(open_requests) >= MAX_OUTSTANDING:
                    stats[kind].skipped += 1
                    continue
                task = asyncio.create_task(one(name, kind, n))
                open_requests.add(task)
                task.add_done_callback(open_requests.discard)

        await asyncio.gather(*(client(n, k, r, i) for i, (n, k, r) in enumerate(clients)))
        if open_requests:
            await asyncio.wait(open_requests, timeout=150)
    return stats


async def sample_process(
    proc: psutil.Process,
    url: str,
    every_s: float,
    stop: asyncio.Event,
    fairness: list[tuple[float, float, float]] | None = None,
) -> list[tuple[float, float, int, int]]:
    """(seconds since start, RSS MiB, open fds, requests inside the router) every
    ``every_s`` until ``stop``: the router's memory grows with the requests it holds, so a
    slope is read against them (-1: the state read failed). ``fairness`` gets (seconds,
    Jain's index, max service gap) of the router's window at each sample."""
    start = time.monotonic()
    rows = []
    timeout = aiohttp.ClientTimeout(total=max(1.0, every_s))
    async with aiohttp.ClientSession(base_url=url, timeout=timeout) as session:
        while not stop.is_set():
            active, jain, gap = await _router_state(session)
            with proc.oneshot():
                rss_mib, fds = proc.memory_info().rss / 2**20, proc.num_fds()
            now_s = time.monotonic() - start
            rows.append((now_s, rss_mib, fds, active))
            if fairness is not None and jain is not None and gap is not None:
                fairness.append((now_s, jain, gap))
            with suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
    return rows


async def _router_state(session: aiohttp.ClientSession) -> tuple[int, float | None, float | None]:
    """Requests held, Jain's index and the max service gap (-1, None, None: unreadable)."""
    try:
        async with session.get("/fairserve/v1/state?limit=1") as resp:
            state = await resp.json()
        return (
            int(state["router"]["active_requests"]),
            float(state["jain_index"]),
            float(state["max_service_gap"]),
        )
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
        return -1, None, None


def _span(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"first": values[0], "last": values[-1], "min": min(values), "max": max(values)}


def slope_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per minute."""
    per_s = slope(points)
    return None if per_s is None else 60 * per_s


def slope(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


async def run_phase(
    url: str,
    proc: psutil.Process,
    clients: list[tuple[str, str, float]],
    args: argparse.Namespace,
    duration_s: float,
) -> dict[str, Any]:
    stop = asyncio.Event()
    fairness: list[tuple[float, float, float]] = []
    sampler = asyncio.create_task(sample_process(proc, url, args.sample_s, stop, fairness))
    started_s = time.monotonic()
    stats = await offer(url, clients, duration_s)
    # Answers per second from the end of the warm-up to the end of the offered load.
    window = (started_s + args.warmup_s, started_s + duration_s)
    answered = sum(s.answered_between(*window) for s in stats.values())
    throughput = answered / max(1e-9, window[1] - window[0])
    stop.set()
    rows = await sampler
    warm = [r for r in rows if r[0] >= args.warmup_s]
    return {
        "classes": {k: v.summary() for k, v in stats.items()},
        "throughput_req_per_s": throughput,
        # The router's fairness window over time: a bounded gap stays flat after warm-up.
        "jain_index": _span([j for t, j, _ in fairness if t >= args.warmup_s]),
        "max_service_gap": _span([g for t, _, g in fairness if t >= args.warmup_s]),
        "max_service_gap_slope_per_min": slope_per_min(
            [(t, g) for t, _, g in fairness if args.warmup_s <= t <= duration_s]
        ),
        "router_rss_mib": {
            "first": rows[0][1],
            "last": rows[-1][1],
            "max": max(r[1] for r in rows),
        },
        "router_rss_slope_mib_per_min": slope_per_min([(t, m) for t, m, _, _ in warm]),
        "router_fds": {"first": rows[0][2], "last": rows[-1][2], "max": max(r[2] for r in rows)},
        "router_fds_slope_per_min": slope_per_min([(t, float(f)) for t, _, f, _ in warm]),
        "router_active_requests": {
            "first": rows[0][3],
            "last": rows[-1][3],
            "max": max(r[3] for r in rows),
        },
        "router_active_slope_per_min": slope_per_min([(t, float(a)) for t, _, _, a in warm]),
        # What each request held in the router costs: RSS against held requests.
        "router_rss_kib_per_active": slope([(float(a), m * 1024) for _, m, _, a in warm if a >= 0]),
        "samples": len(rows),
        "series": [
            {"t_s": round(t, 1), "rss_mib": round(m, 2), "fds": f, "active": a}
            for t, m, f, a in rows
        ],
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with cluster(args) as (url, proc):
        reported = reported_capacity_req_per_s(url, args.speed)
        bounds = running_bounds(url)
        concurrency = args.calibrate_concurrency or math.ceil(1.25 * sum(bounds))
        capacity = args.rate or asyncio.run(
            measured_capacity_req_per_s(url, args.calibrate_s, concurrency)
        )
        light_rate = args.light_share * capacity / max(1, args.light)
        heavy_total = max(0.0, args.overload * capacity - light_rate * args.light)
        heavy_rate = heavy_total / max(1, args.heavy)
        light = [(f"light-{i}", "light", light_rate) for i in range(args.light)]
        heavy = [(f"heavy-{i}", "heavy", heavy_rate) for i in range(args.heavy)]
        report: dict[str, Any] = {
            "capacity_req_per_s": capacity,
            "capacity_source": "--rate"
            if args.rate
            else f"measured over {args.calibrate_s:g} s by {concurrency} closed-loop senders",
            "worker_running_bounds": bounds,
            "client_timeout_s": CLIENT_TIMEOUT_S,
            "profile_peak_req_per_s": reported,
            "rates_req_per_s": {"light_each": light_rate, "heavy_each": heavy_rate},
            "duration_s": args.duration,
            "machine": "see the caller",
        }
        if args.baseline:
            baseline_s = args.baseline_duration or args.duration
            report["baseline"] = asyncio.run(run_phase(url, proc, light, args, baseline_s))
        report["overload"] = asyncio.run(run_phase(url, proc, light + heavy, args, args.duration))
        base = report.get("baseline", {}).get("classes", {}).get("light", {})
        over = report["overload"]["classes"].get("light", {})
        if base.get("latency_p99_s") and over.get("latency_p99_s"):
            report["light_p99_ratio"] = over["latency_p99_s"] / base["latency_p99_s"]
        report["throughput_over_capacity"] = report["overload"]["throughput_req_per_s"] / capacity
    print(json.dumps(report, indent=1))
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=60.0, help="seconds of offered load")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--speed", type=float, default=0.05, help="worker --speed (slower: cheaper)")
    p.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        help="extra fairserve worker option (repeat; e.g. --worker-arg=--max-running-requests=64)",
    )
    p.add_argument("--heavy", type=int, default=10)
    p.add_argument("--light", type=int, default=40)
    p.add_argument("--overload", type=float, default=2.0, help="offered load / capacity")
    p.add_argument("--light-share", type=float, default=0.45, help="light demand / capacity")
    p.add_argument("--rate", type=float, default=None, help="capacity in req/s (else measured)")
    p.add_argument("--calibrate-s", type=float, default=150.0, help="capacity measurement")
    p.add_argument(
        "--calibrate-concurrency",
        type=int,
        default=None,
        help="closed-loop senders (default 1.25x the sum of the workers' running bounds)",
    )
    p.add_argument("--baseline", action="store_true", help="light clients alone first")
    p.add_argument("--baseline-duration", type=float, default=None, help="(default --duration)")
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--warmup-s", type=float, default=30.0)
    p.add_argument("router_args", nargs="*", help="extra fairserve router options (after --)")
    return p


if __name__ == "__main__":
    sys.exit(main())
