"""The router follows a worker's eviction feed, which needs the admin token when one is set
(the feed carries every tenant's prompts), by sending the token it holds."""

from __future__ import annotations

from tests.router.helpers import poll, post, sim_router
from tests.worker.helpers import run, tiny_profile

TOKEN = "s3cret"


def _prompt(index: int) -> dict[str, object]:
    return {"prompt": f"document {index} " + "words to fill the cache " * 60, "max_tokens": 2}


def test_a_router_with_the_token_follows_a_worker_that_requires_it() -> None:
    async def body() -> None:
        worker = {"admin_token": TOKEN, "profile": tiny_profile(1024)}
        async with sim_router(1, worker=worker, admin_token=TOKEN) as (server, session, _):
            (up,) = server.router.upstreams.values()
            for index in range(12):  # ~3 prompts fill the 1,024-token pool: evictions follow
                status, answer, _ = await post(session, "/v1/completions", _prompt(index))
                assert status == 200, answer

            async def evictions_read() -> bool:  # the router polls every 0.1 s
                return up.eviction_cursor > 0

            await poll(evictions_read, timeout_s=5.0, what="an eviction read by the router")
            assert up.eviction_cursor > 0, "the router read no eviction (refused by the worker?)"
            assert up.extension

    run(body())
