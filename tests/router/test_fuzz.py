"""Fuzzed request bodies never make the router answer 5xx (it has a healthy worker, so not
even 503), every error carries a message, and the lean front answers exactly like the
aiohttp path (``lean_front=False``)."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairserve.router.server import RouterServer
from fairserve.worker.server import WorkerServer
from tests.router.helpers import router_config
from tests.worker.helpers import make_config

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5000),
    st.floats(allow_nan=True),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
fields = st.sampled_from(
    ["messages", "prompt", "max_tokens", "stream", "stream_options", "model", "user", "n",
     "text", "input_ids", "sampling_params", "rid", "routing_key", "max_completion_tokens"]
)  # fmt: skip
bodies = st.one_of(st.dictionaries(fields, values, max_size=5), values)
paths = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/generate"])


@pytest.fixture(scope="module")
def routers() -> Iterator[tuple[str, str]]:
    """A worker and two routers in front of it (lean front, aiohttp only) on their own
    event loop in a thread, shared by all examples."""
    loop = asyncio.new_event_loop()

    async def start() -> tuple[WorkerServer, RouterServer, RouterServer]:
        worker = WorkerServer(make_config(speed=2000.0), "127.0.0.1", 0)
        await worker.start()
        lean = RouterServer(router_config([worker.url]))
        plain = RouterServer(router_config([worker.url], lean_front=False))
        await lean.start()
        await plain.start()
        return worker, lean, plain

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    worker, lean, plain = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=20)
    try:
        yield lean.url, plain.url
    finally:

        async def stop() -> None:
            await lean.stop(drain_timeout_s=1.0)
            await plain.stop(drain_timeout_s=1.0)
            await worker.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(path=paths, body=bodies)
def test_fuzzed_bodies_never_5xx(routers: tuple[str, str], path: str, body: Any) -> None:
    status, text = _post(routers[0] + path, json.dumps(body, allow_nan=True).encode())
    assert status < 500, (status, text)
    if status >= 400:
        assert json.loads(text)["error"]["message"]


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(path=paths, body=bodies, client=st.text(max_size=6))
def test_lean_front_answers_like_aiohttp(
    routers: tuple[str, str], path: str, body: Any, client: str
) -> None:
    data = json.dumps(body, allow_nan=True).encode()
    headers = {"X-Fairserve-Client": client} if client.isprintable() and client.isascii() else {}
    lean = _post(routers[0] + path, data, headers)
    plain = _post(routers[1] + path, data, headers)
    assert lean[0] == plain[0], (lean, plain)
    if lean[0] >= 400:
        assert json.loads(lean[1]) == json.loads(plain[1])


def _post(url: str, data: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
