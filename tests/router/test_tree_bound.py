"""The router's global prefix tree stays bounded per worker even when a worker reports no KV
capacity (a stock engine): without a bound, every distinct prompt stayed in the tree for
good (measured: RSS 65 → 244 MiB over 150,000 prompts, growing ~1.1 KB a request)."""

from __future__ import annotations

from fairserve.router.fairqueue import DEFAULT_CACHE_TOKENS
from tests.router.helpers import chat, post, routed
from tests.router.stock import StockUpstream
from tests.worker.helpers import run

PROMPT_CHARS = 128 * 1024
"""32,768 key units a prompt: 40 of them are 1.25x the default bound of 2^20 units."""


def test_the_tree_is_bounded_for_a_worker_that_reports_no_capacity() -> None:
    async def body() -> None:
        stock = StockUpstream(slots=8)
        await stock.start()
        try:
            async with routed([stock.url]) as (server, session):
                (up,) = server.router.upstreams.values()
                assert not up.max_total_tokens  # the stock engine reports none
                for index in range(40):
                    prompt = f"{index:04d} " + "x" * PROMPT_CHARS
                    status, answer, _ = await post(
                        session, "/v1/chat/completions", chat(prompt, max_tokens=2)
                    )
                    assert status == 200, answer
                tree = server.router.dispatcher.prefixes.tree
                assert 0 < tree.owner_tokens(up.url) <= DEFAULT_CACHE_TOKENS
        finally:
            await stock.stop()

    run(body())
