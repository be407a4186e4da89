"""Many distinct client names against a real router: memory and state-read latency.

A hostile or careless caller can send every request under a new ``X-Fairserve-Client``.
This starts two simulated workers and a router as processes, sends ``--names`` tiny
requests each under a new name (``--concurrency`` at a time), and prints the router's RSS
and the time of a ``/fairserve/v1/state`` read at every ``--every`` names, then again after
``--idle-s`` seconds of idleness (the history must not keep growing). Bounded in count and
time. Example::

    python -m tests.perf.names_router --names 100000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import aiohttp
import psutil

from tests.perf.soak_router import cluster


async def _state_read_s(session: aiohttp.ClientSession) -> tuple[float, int, int]:
    started = time.perf_counter()
    async with session.get("/fairserve/v1/state") as resp:
        body = await resp.read()
    return time.perf_counter() - started, len(body), resp.status


async def run(url: str, proc: psutil.Process, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    sent = 0
    statuses: dict[int, int] = {}
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(base_url=url, timeout=timeout, connector=connector) as s:

        async def one(n: int) -> None:
            body = {"prompt": "hi", "max_tokens": 1}
            headers = {"X-Fairserve-Client": f"name-{n}"}
            async with s.post("/v1/completions", json=body, headers=headers) as resp:
                await resp.read()
                statuses[resp.status] = statuses.get(resp.status, 0) + 1

        async def record(label: str) -> None:
            read_s, size, status = await _state_read_s(s)
            rows.append({
                "names": sent,
                "at": label,
                "rss_mib": round(proc.memory_info().rss / 2**20, 1),
                "state_read_ms": round(read_s * 1000, 1),
                "state_bytes": size,
                "state_status": status,
                "answers": dict(statuses),
            })  # fmt: skip

        await record("start")
        deadline = time.monotonic() + args.max_s
        while sent < args.names and time.monotonic() < deadline:
            batch = min(args.every, args.names - sent)
            for start in range(0, batch, args.concurrency):
                count = min(args.concurrency, batch - start)
                await asyncio.gather(*(one(sent + start + k) for k in range(count)))
            sent += batch
            await record("sending")
        await asyncio.sleep(args.idle_s)
        await record(f"idle {args.idle_s:g}s")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--names", type=int, default=100_000)
    p.add_argument("--every", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--idle-s", type=float, default=30.0)
    p.add_argument("--max-s", type=float, default=900.0, help="stop sending after this")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--speed", type=float, default=1000.0)
    p.add_argument("--worker-arg", action="append", default=[], help="a worker option")
    p.add_argument("router_args", nargs="*")
    args = p.parse_args(argv)
    with cluster(args) as (url, proc):
        rows = asyncio.run(run(url, proc, args))
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
