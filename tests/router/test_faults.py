"""Faults: a worker process killed mid-run and restarted; a client that goes away."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import aiohttp

from tests.router.helpers import chat, get_json, leave_while_running, poll, routed, sim_workers
from tests.worker.helpers import run, runtime_of
from tests.worker.processes import free_port, read_ready_url, spawn, stop, worker_command


def _start_worker(port: int, profile: Path) -> Any:
    proc = spawn(worker_command("--port", str(port), "--speed", "50", "--profile", str(profile)))
    read_ready_url(proc)
    return proc


def test_killed_worker_is_retried_ejected_and_reinstated(tmp_path: Path) -> None:
    from tests.worker.helpers import write_profile

    profile = write_profile(tmp_path)
    ports = [free_port(), free_port()]
    procs = [_start_worker(port, profile) for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]

    async def body() -> None:
        # round-robin spreads requests over both workers, so the kill hits in-flight ones.
        async with routed(urls, dispatch="round-robin") as (server, session):
            statuses: list[int] = []

            async def client(n: int) -> None:
                for i in range(n):
                    request = chat(content=f"request {i}", max_tokens=20)
                    async with session.post("/v1/chat/completions", json=request) as resp:
                        answer = await resp.json()
                        statuses.append(resp.status)
                        if resp.status == 200:
                            assert answer["usage"]["completion_tokens"] == 20
                        else:
                            assert answer["error"]["message"], answer

            load = asyncio.gather(*(client(15) for _ in range(4)))
            await poll(lambda: _done(statuses, 10), what="some requests before the kill")
            procs[0].send_signal(signal.SIGKILL)
            await load
            assert len(statuses) == 60
            assert statuses.count(200) == 60, statuses  # non-streamed: always retried
            state = server.router.upstreams[urls[0]]
            assert not state.healthy and state.ejections == 1
            # The router keeps serving on the other worker.
            async with session.post("/v1/chat/completions", json=chat()) as resp:
                assert resp.status == 200
            procs[0] = _start_worker(ports[0], profile)
            await poll(lambda: _healthy(session, urls[0]), what="reinstatement")
            _, view = await get_json(session, "/fairserve/v1/state")
            worker = next(w for w in view["workers"] if w["url"] == urls[0])
            assert worker["reinstatements"] == 1 and worker["failures"] >= 1

    try:
        run(body())
    finally:
        for proc in procs:
            stop(proc, signal.SIGKILL)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


async def _done(statuses: list[int], count: int) -> bool:
    return len(statuses) >= count


async def _healthy(session: aiohttp.ClientSession, url: str) -> bool:
    _, view = await get_json(session, "/fairserve/v1/state")
    return any(w["url"] == url and w["healthy"] for w in view["workers"])


def test_client_disconnect_aborts_the_upstream_request() -> None:
    async def body() -> None:
        async with (
            sim_workers(1, speed=1.0) as workers,
            routed([workers[0].url]) as (server, session),
        ):
            runtime = runtime_of(workers[0])
            request = chat(max_tokens=2000, stream=True)
            async with session.post("/v1/chat/completions", json=request) as resp:
                assert resp.status == 200
                await resp.content.readline()
            # Leaving the block closed the connection mid-stream.

            async def aborted() -> bool:
                engine = runtime.state()["engine"]
                return bool(engine["aborted"] >= 1 and runtime.state()["running"] == 0)

            await poll(aborted, what="the worker to abort the request")
            await poll(lambda: _idle(server), what="the router to account the abort")
            _, view = await get_json(session, "/fairserve/v1/state")
            assert view["clients"]["anonymous"]["aborted"] == 1
            assert view["workers"][0]["outstanding"] == 0

    run(body())


async def _idle(server: Any) -> bool:
    return bool(server.router.active == 0)


def test_client_leaving_a_non_streamed_request_aborts_it_upstream() -> None:
    """No byte of the answer was read yet: the router still aborts the worker's request."""

    async def body() -> None:
        async with (
            sim_workers(1, speed=1.0) as workers,
            routed([workers[0].url]) as (server, session),
        ):
            runtime = runtime_of(workers[0])
            await leave_while_running(session, runtime)
            await poll(lambda: _idle(server), what="the router to account the abort")
            _, view = await get_json(session, "/fairserve/v1/state")
            assert view["clients"]["anonymous"]["aborted"] == 1

    run(body())
