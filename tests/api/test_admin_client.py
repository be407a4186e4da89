"""The router's admin client (``fairserve.api.admin_client``) against a real router.

A router in front of simulated workers listens on 127.0.0.1; the synchronous client runs
in a thread (as ``tune`` and ``status`` block) while the router serves on the test's loop.
"""

from __future__ import annotations

import asyncio
import math
import re
import socket
from collections.abc import Callable
from typing import TypeVar

import pytest

from fairserve.api.admin_client import (
    NOT_A_ROUTER,
    AdminClient,
    AdminRefused,
    RouterUnreachable,
    error_message,
    quantum_body,
    state_query,
    status_text,
)
from fairserve.api.router_schema import (
    RouterInfo,
    RouterQuantum,
    RouterState,
    RouterWeights,
    WeightResult,
)
from fairserve.core.errors import ConfigError, FairserveError
from tests.router.helpers import routed, sim_workers
from tests.worker.helpers import run

TOKEN = "admin-s3cret"
T = TypeVar("T")


async def _in_thread(call: Callable[[], T]) -> T:
    """Run a blocking client call without blocking the router on this loop."""
    return await asyncio.to_thread(call)


def _router_test(check: Callable[[str], None], **overrides: object) -> None:
    """Start two simulated workers and a router (admin token ``TOKEN``), run ``check(url)``
    in a thread."""

    async def body() -> None:
        async with (
            sim_workers(2) as workers,
            routed([w.url for w in workers], admin_token=TOKEN, **overrides) as (server, _),
        ):
            url = server.url
            assert url is not None
            await _in_thread(lambda: check(url.rstrip("/")))

    run(body())


def test_reads_give_the_state_quantum_and_weights_documents() -> None:
    def check(url: str) -> None:
        client = AdminClient(url)  # reads need no token
        state = client.state(window_s=5)
        assert state["router"]["policy"] == "dlpm"
        assert state["fairness"]["window_s"] == 5  # the query reached the router
        assert len(state["workers"]) == 2
        assert client.quantum()["policy"] == "dlpm"
        assert client.weights()["changed"] == {}

    _router_test(check)


def test_the_schema_names_every_key_the_router_writes() -> None:
    """The typed documents and what ``router.state`` and the handlers build cannot drift."""

    def check(url: str) -> None:
        client = AdminClient(url, TOKEN)
        state = client.state()
        assert set(state) == set(RouterState.__annotations__)
        assert set(state["router"]) == set(RouterInfo.__annotations__)
        assert set(state["quantum"]) == set(RouterQuantum.__annotations__) - {"worker_errors"}
        assert set(client.quantum()) == set(state["quantum"])
        assert set(client.set_quantum(quantum=300)) == set(RouterQuantum.__annotations__)
        assert set(client.weights()) == set(RouterWeights.__annotations__)
        assert set(client.set_weight("team-b", 3.0)) == set(WeightResult.__annotations__)

    _router_test(check)


def test_writes_with_the_token_change_quantum_and_weight() -> None:
    def check(url: str) -> None:
        client = AdminClient(url, TOKEN)
        view = client.set_quantum(quantum=512, worker_quantum=math.inf)
        assert view["quantum"] == 512 and view["quantum_source"] == "set"
        assert view["worker_quantum"] == "inf"  # JSON has no infinity: the api rule
        assert view["worker_errors"] == []
        result = client.set_weight("team-a", 2.0)
        assert (result["client"], result["weight"], result["previous"]) == ("team-a", 2.0, 1.0)
        assert client.weights()["changed"] == {"team-a": 2.0}

    _router_test(check)


def test_refusals_name_the_router_and_say_what_to_do() -> None:
    def check(url: str) -> None:
        with pytest.raises(ConfigError, match="needs the router's admin token: pass --token"):
            AdminClient(url).set_quantum(quantum=1234)  # refused before any request
        with pytest.raises(AdminRefused, match=f"PUT {url}/fairserve/v1/quantum: wrong admin"):
            AdminClient(url, "not-the-token").set_quantum(quantum=1234)
        with pytest.raises(ConfigError, match="the router refused the value: quantum"):
            AdminClient(url, TOKEN).set_quantum(quantum=-1)
        assert AdminClient(url).quantum()["quantum"] != 1234  # nothing was written

    _router_test(check)


def test_a_url_without_the_admin_api_is_not_a_router() -> None:
    async def body() -> None:
        async with sim_workers(1) as workers:
            url = workers[0].url
            with pytest.raises(FairserveError, match=re.escape(f"not found ({NOT_A_ROUTER})")):
                await _in_thread(lambda: AdminClient(url).state())

    run(body())


def test_an_unreachable_router_is_a_connection_error_with_urllibs_reason() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(RouterUnreachable) as caught:
        AdminClient(url, timeout_s=2.0).state()
    assert isinstance(caught.value, ConnectionError)  # status's exit 3 path
    assert str(caught.value.reason) == "[Errno 111] Connection refused"
    assert str(caught.value) == f"router {url} is unreachable: [Errno 111] Connection refused"


def test_pure_helpers_shared_with_top() -> None:
    assert state_query() == {} and state_query(60.0) == {"window_s": "60"}
    assert quantum_body() == {}
    assert quantum_body(256.0, math.inf) == {"quantum": 256.0, "worker_quantum": "inf"}
    assert quantum_body(math.inf) == {"quantum": "inf"}
    refusal = b'{"error": {"message": "wrong admin token", "type": "permission_error"}}'
    assert error_message(refusal) == "wrong admin token"
    assert error_message(b'{"detail": 1}') is None
    assert error_message(b"Bad Gateway") == "Bad Gateway"
    assert error_message(b"x" * 500) == "x" * 200
    assert status_text(403, refusal) == "HTTP 403: wrong admin token"
    assert status_text(502, b"") == "HTTP 502"
