"""The router's aborts carry its admin token: a worker beyond loopback requires it."""

from __future__ import annotations

import asyncio

from tests.api.servers import serving_beyond_loopback
from tests.router.helpers import chat, poll, routed
from tests.worker.helpers import make_config, run


def test_a_client_leaving_aborts_its_request_on_a_worker_beyond_loopback() -> None:
    """Non-streamed: the worker writes nothing until the end, so only the router's
    ``/abort_request`` (with the token) can end the request of a client gone."""

    async def body() -> None:
        config = make_config(admin_token="s3cret", speed=1.0)
        async with (
            serving_beyond_loopback(config) as (url, runtime),
            routed([url], admin_token="s3cret") as (_, session),
        ):
            waiting = asyncio.create_task(
                session.post("/v1/chat/completions", json=chat(max_tokens=2000))
            )

            async def running() -> bool:
                return bool(runtime.state()["running"] >= 1)

            await poll(running, what="the worker to start the request")
            waiting.cancel()  # closes the client's connection

            async def aborted() -> bool:
                engine = runtime.state()["engine"]
                return bool(engine["aborted"] >= 1 and runtime.state()["running"] == 0)

            await poll(aborted, what="the worker to abort the request")

    run(body())
