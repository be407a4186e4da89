"""One cache model per fleet (issue 21): a worker's router-side fair queue reads and records
the dispatcher's model of its cache, so both see the same match lengths, the worker's
eviction feed reaches both, one bound applies, and a waiting request never matches itself.

Prompts are token ids, whose router keys are exact (``tokens_to_key``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from fairserve.core.types import Request, make_request
from fairserve.router.fairqueue import DEFAULT_CACHE_TOKENS, FairQueue
from fairserve.router.server import RouterServer
from fairserve.sched.dispatch.cache_model import CacheModel
from fairserve.sched.registry import make_local_policy
from tests.router.helpers import poll, post, routed, sim_router
from tests.router.stock import StockUpstream
from tests.worker.helpers import run, tiny_profile


def _prompt(group: int, index: int, shared: int = 48, own: int = 16) -> list[int]:
    """``shared`` ids common to the group, then ``own`` ids of this prompt alone."""
    return [1000 + group] * shared + [10_000 + 100 * group + index] * own


async def _send(session: aiohttp.ClientSession, ids: list[int], client: str = "a") -> None:
    headers = {"X-Fairserve-Client": client}
    body = {"prompt": ids, "max_tokens": 2}
    status, answer, _ = await post(session, "/v1/completions", body, headers=headers)
    assert status == 200, answer


def _queues(server: RouterServer) -> dict[str, FairQueue]:
    queues = {url: up.queue for url, up in server.router.upstreams.items()}
    assert all(q is not None for q in queues.values()), queues
    return {url: q for url, q in queues.items() if q is not None}


def _probe(ids: list[int]) -> Request:
    return make_request("probe", "a", ids, 2)


@pytest.mark.parametrize("dispatch", ["cache-aware", "doubleq", "round-robin"])
def test_the_fair_queues_and_the_dispatcher_see_the_same_match_lengths(dispatch: str) -> None:
    """Also for a dispatcher that reads no cache (round robin): its queues still get one."""

    async def body() -> None:
        async with sim_router(2, router_queue="on", dispatch=dispatch) as (server, session, _):
            for index in range(6):
                await _send(session, _prompt(index % 3, index))
            model = server.router.dispatcher.prefixes
            queues = _queues(server)
            dispatched = server.router.dispatcher.dispatched
            # A queue gets the model with its worker's first dispatch (before it queues).
            assert all(q.cache is model for url, q in queues.items() if dispatched[url])
            seen = 0
            for group in range(4):  # group 3 was never sent
                probe = _probe(_prompt(group, 99))
                match = model.match(probe.prompt_key)
                for url, queue in queues.items():
                    length = queue._match_len(probe)
                    assert length == model.match_len(probe.prompt_key, url)
                    if url in match.owners:
                        assert length == match.tokens
                    else:  # a shorter prefix, or nothing of a prompt no worker holds
                        assert length < match.tokens or length == match.tokens == 0
                    seen += length
                assert (match.tokens == 48) == (group < 3)
            assert seen >= 3 * 48  # each sent group's prefix is held by some worker

    run(body())


def test_an_eviction_from_the_workers_feed_reaches_dispatch_and_queue_alike() -> None:
    async def body() -> None:
        worker = {"profile": tiny_profile(1024)}
        async with sim_router(1, worker=worker, router_queue="on", dispatch="cache-aware") as (
            server,
            session,
            _,
        ):
            (url,) = server.router.upstreams
            (queue,) = _queues(server).values()
            model = server.router.dispatcher.prefixes
            first_ids = _prompt(0, 0, shared=200, own=40)
            first = _probe(first_ids)
            await _send(session, first_ids)
            assert queue._match_len(first) == first.input_tokens
            # 6 prompts of 240 ids overfill the worker's 1,024-token pool (evictions) but not
            # the router's bound for a worker with a feed (2 x 1,024): only the feed forgets.
            for group in range(1, 6):
                await _send(session, _prompt(group, 0, shared=200, own=40))

            async def forgotten() -> bool:  # the router polls the feed every 0.1 s
                return queue._match_len(first) < first.input_tokens

            await poll(forgotten, timeout_s=5.0, what="the first prompt's eviction")
            assert model.match(first.prompt_key).tokens == queue._match_len(first)
            assert server.router.upstreams[url].eviction_cursor > 0

    run(body())


def test_one_bound_for_a_stock_worker_applies_to_what_its_queue_records() -> None:
    """A stock engine reports no capacity: its share of the one model stays within the
    default bound, and the queue reports that share (it keeps no tree of its own)."""

    async def body() -> None:
        stock = StockUpstream(slots=4)
        await stock.start()
        try:
            async with routed([stock.url], dispatch="cache-aware") as (server, session):
                (queue,) = _queues(server).values()  # auto: a stock worker gets a queue
                model = server.router.dispatcher.prefixes
                units = 1 << 15  # 40 prompts are 1.25x the bound
                for index in range(40):
                    await _send(session, [index] + [7] * (units - 1))
                    tokens = model.worker_tokens(stock.url)
                    assert 0 < tokens <= DEFAULT_CACHE_TOKENS
                    assert queue.snapshot()["cache_tokens"] == tokens
                assert queue.cache is model
        finally:
            await stock.stop()

    run(body())


def test_a_waiting_request_does_not_match_itself() -> None:
    async def body() -> None:
        stock = StockUpstream(slots=1, service_s=0.3)
        await stock.start()
        try:
            async with routed(
                [stock.url], dispatch="cache-aware", max_outstanding_per_worker=1
            ) as (server, session):
                (queue,) = _queues(server).values()
                model = server.router.dispatcher.prefixes
                running, waiting = _probe(_prompt(0, 0)), _probe(_prompt(1, 0))
                first = asyncio.create_task(_send(session, _prompt(0, 0)))
                await poll(_true_when(lambda: queue.outstanding == 1), what="the first send")
                second = asyncio.create_task(_send(session, _prompt(1, 0)))
                await poll(_true_when(lambda: queue.waiting == 1), what="the second to wait")
                assert queue._match_len(running) == running.input_tokens
                assert queue._match_len(waiting) == 0
                assert model.match(waiting.prompt_key).tokens == 0  # dispatch does not see it
                await asyncio.gather(first, second)
                assert queue._match_len(waiting) == waiting.input_tokens  # released: recorded
        finally:
            await stock.stop()

    run(body())


def _true_when(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def condition() -> bool:
        return bool(check())

    return condition


def test_a_queue_on_its_own_models_its_worker_alone_bounded_by_cache_tokens() -> None:
    async def body() -> None:
        queue = FairQueue(make_local_policy("dlpm"), max_outstanding=4, cache_tokens=100)
        for index in range(10):
            req = make_request(f"r{index}", "a", [index] * 30, 2)
            await queue.acquire(req)
            assert queue.cache.worker_tokens(queue.worker) <= 100
            queue.finish(req, 2, 0)
        shared = CacheModel()
        queue.attach(shared, "w0")
        req = make_request("s", "a", [5] * 30, 2)
        await queue.acquire(req)
        assert shared.match_len(req.prompt_key, "w0") == 30

    run(body())
