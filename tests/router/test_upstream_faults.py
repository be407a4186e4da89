"""Workers that hang, stall, answer garbage or fail: requests are retried elsewhere or end
with a clear error, never wait for a dead worker, and the broken worker leaves rotation."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from fairserve.router.server import RouterServer
from tests.router.faulty import FaultyUpstream, Mode
from tests.router.helpers import chat, get_json, poll, post, routed, sim_router, sim_workers
from tests.worker.helpers import run

FAST_FAULTS: dict[str, Any] = {
    "health_interval_s": 0.1,
    "health_timeout_s": 0.3,
    "stall_timeout_s": 0.5,
    "outlier_cooldown_s": 30.0,
}


@asynccontextmanager
async def beside_a_good_worker(
    mode: Mode, start_mode: Mode = "ok", good: int = 1
) -> AsyncIterator[tuple[RouterServer, aiohttp.ClientSession, FaultyUpstream]]:
    """A router over ``good`` simulated workers and one faulty upstream (healthy at start,
    then switched to ``mode``)."""
    faulty = FaultyUpstream(start_mode)
    await faulty.start()
    try:
        async with sim_workers(good) as workers:
            urls = [faulty.url, *(w.url for w in workers)]
            async with routed(urls, dispatch="round-robin", **FAST_FAULTS) as (server, session):
                await poll(_all_healthy(session, len(urls)), timeout_s=5.0, what="every worker up")
                faulty.mode = mode
                yield server, session, faulty
    finally:
        await faulty.stop()


def _all_healthy(session: aiohttp.ClientSession, count: int) -> Any:
    async def check() -> bool:
        _, state = await get_json(session, "/fairserve/v1/state")
        return bool(sum(w["healthy"] for w in state["workers"]) == count)

    return check


async def _worker_state(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    _, state = await get_json(session, "/fairserve/v1/state")
    return next(w for w in state["workers"] if w["url"] == url)


def test_requests_sent_to_a_hung_worker_are_retried_elsewhere() -> None:
    async def body() -> None:
        async with beside_a_good_worker("hang") as (_, session, faulty):
            started = time.monotonic()
            answers = await asyncio.gather(
                *(post(session, "/v1/chat/completions", chat(f"q{i}")) for i in range(20)),
                *(_stream_text(session, chat(f"s{i}", stream=True)) for i in range(10)),
            )
            elapsed_s = time.monotonic() - started
            assert faulty.generations > 0, "the hung worker must have been tried"
            statuses = [a[0] for a in answers[:20]]
            assert statuses == [200] * 20
            assert all(text for text in answers[20:])
            assert elapsed_s < 5.0, f"requests waited {elapsed_s:.1f}s for a hung worker"
            assert not (await _worker_state(session, faulty.url))["healthy"]

    run(body())


async def _stream_text(session: aiohttp.ClientSession, body: dict[str, Any]) -> str:
    async with session.post("/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        raw = await resp.text()
    events = [e[6:] for e in raw.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]", raw
    return "".join(
        json.loads(e)["choices"][0]["delta"].get("content", "")
        for e in events[:-1]
        if json.loads(e).get("choices")
    )


def test_a_stalled_stream_ends_with_an_error_event_and_ejects_the_worker() -> None:
    async def body() -> None:
        async with beside_a_good_worker("stall", good=0) as (_, session, faulty):
            started = time.monotonic()
            async with session.post("/v1/chat/completions", json=chat(stream=True)) as resp:
                assert resp.status == 200
                raw = await resp.text()
            elapsed_s = time.monotonic() - started
            assert "hello" in raw
            events = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
            assert events[-1]["error"]["code"] == 502
            assert "stalled" in events[-1]["error"]["message"]
            assert elapsed_s < 3.0
            worker = await _worker_state(session, faulty.url)
            assert not worker["healthy"] and "stalled" in worker["last_error"]

    run(body())


def test_garbage_answers_are_never_relayed() -> None:
    async def body() -> None:
        for mode in ("html", "garbage"):
            async with beside_a_good_worker(mode) as (_, session, faulty):
                for i in range(12):
                    status, answer, _ = await post(session, "/v1/chat/completions", chat(f"{i}"))
                    assert status == 200, answer
                    assert answer["choices"][0]["message"]["content"]
                assert 1 <= faulty.generations <= 3, "ejected after 3 bad answers"
                worker = await _worker_state(session, faulty.url)
                assert not worker["healthy"] and "invalid answer" in worker["last_error"]

    run(body())


def test_garbage_from_the_only_worker_is_a_clear_502() -> None:
    async def body() -> None:
        async with beside_a_good_worker("html", good=0) as (_, session, _):
            status, answer, _ = await post(session, "/v1/chat/completions", chat())
            assert status == 502
            assert "invalid answer" in answer["error"]["message"]
            assert "<html>" not in answer["error"]["message"]

    run(body())


def test_a_worker_answering_500_leaves_rotation_despite_a_good_health_check() -> None:
    async def body() -> None:
        async with beside_a_good_worker("error") as (_, session, faulty):
            for i in range(30):
                status, _, _ = await post(session, "/v1/chat/completions", chat(f"{i}"))
                assert status == 200
            await asyncio.sleep(0.5)  # several health checks pass meanwhile
            for i in range(10):
                status, _, _ = await post(session, "/v1/chat/completions", chat(f"late{i}"))
                assert status == 200
            assert faulty.generations == 3, "held out after 3 failures, /health or not"
            worker = await _worker_state(session, faulty.url)
            assert not worker["healthy"] and worker["ejections"] == 1

    run(body())


def test_prefixes_of_requests_aborted_before_prefill_do_not_pile_up() -> None:
    """A request aborted while it waited was recorded in the router's tree at dispatch but
    never cached by the worker, so no eviction will remove it: the tree stays within twice
    the worker's KV capacity anyway."""

    async def body() -> None:
        async with sim_router(1, worker={"speed": 0.2}) as (server, session, _):
            capacity = next(iter(server.router.upstreams.values())).max_total_tokens
            assert capacity
            short = aiohttp.ClientTimeout(total=0.2)

            async def abandoned(n: int) -> None:
                body = chat(f"{n} " + "word " * 200, max_tokens=64)
                with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                    async with session.post("/v1/chat/completions", json=body, timeout=short) as r:
                        await r.read()

            for start in range(0, 300, 50):
                await asyncio.gather(*(abandoned(n) for n in range(start, start + 50)))
            tree = server.router.dispatcher.snapshot()["tree_tokens"]
            assert tree <= 2 * capacity, (tree, capacity)

    run(body())
