"""The router's aborts carry its admin token: a worker beyond loopback requires it."""

from __future__ import annotations

from tests.api.servers import serving_beyond_loopback
from tests.router.helpers import leave_while_running, routed
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
            await leave_while_running(session, runtime)

    run(body())
