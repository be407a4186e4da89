"""Fuzzed request bodies never make the router answer 5xx (it has a healthy worker, so not
even 503), every error carries a message, and the lean front answers exactly like the
aiohttp path (``lean_front=False``).

The hostile bodies (issue 18 items 6 and 12) are rendered to bytes here, so they can hold
what ``json.dumps`` cannot make: nesting thousands of levels deep, ``NaN`` and
``Infinity`` literals, integers of thousands of digits, lone surrogate escapes; around
them, huge arrays, numbers as strings and extreme values in every field, often on top of
an otherwise valid body so that the deeper checks are reached."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, NamedTuple

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


class Raw(NamedTuple):
    """JSON text used as is."""

    text: bytes


class Deep(NamedTuple):
    """``inner`` wrapped ``depth`` times in arrays or in objects."""

    depth: int
    objects: bool
    inner: Any


def render(value: Any) -> bytes:
    """``value`` as JSON text; :class:`Raw` and :class:`Deep` as they say."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Deep):
        opening, closing = (b'{"k":', b"}") if value.objects else (b"[", b"]")
        return opening * value.depth + render(value.inner) + closing * value.depth
    if isinstance(value, dict):
        items = (json.dumps(k).encode() + b":" + render(v) for k, v in value.items())
        return b"{" + b",".join(items) + b"}"
    if isinstance(value, list):
        if all(v is None or isinstance(v, int | str) for v in value):  # huge flat arrays
            return json.dumps(value).encode()
        return b"[" + b",".join(render(v) for v in value) + b"]"
    return json.dumps(value, allow_nan=True).encode()


RAW_LITERALS = [b"NaN", b"Infinity", b"-Infinity", b"9" * 5000, b"1e400", b"-0", b"1E20",
                b'"\\ud800"', b'"a\\udfffb"', b'"\\u0000"', b'"\\ud83d\\ude00"']  # fmt: skip
EXTREME_INTS = [0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63)]
NUMBER_STRINGS = ["1", "16", "1e20", "NaN", "-1", "0.5", "true", "", "Infinity"]
ODD_TEXTS = ["\ud800", "a\udfffb", "\x00", "\u2028", "\U0001f600" * 3, "x" * 70_000, " "]
HUGE_ARRAYS: list[Any] = [[7] * 100_000, [[1]] * 1000, ["a"] * 20_000, [None] * 1000]

hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(EXTREME_INTS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e20, -1e20, 1e-300, 0.5, 2.0000001, -0.0]),
    st.text(max_size=12),
    st.sampled_from(NUMBER_STRINGS + ODD_TEXTS),
    st.sampled_from(RAW_LITERALS).map(Raw),
)
hostile_values = st.recursive(
    hostile_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["text", "role", "content", "type", "x"]), inner,
                          max_size=3)
        | st.builds(Deep, st.integers(1, 6000), st.booleans(), inner)
        | st.sampled_from(HUGE_ARRAYS)
    ),
    max_leaves=6,
)  # fmt: skip
SAMPLING = ["temperature", "top_p", "n", "presence_penalty", "frequency_penalty", "seed",
            "stop", "logprobs", "ignore_eos", "max_new_tokens"]  # fmt: skip
hostile_fields = st.sampled_from(
    ["messages", "prompt", "max_tokens", "stream", "stream_options", "model", "user", "text",
     "input_ids", "sampling_params", "rid", "routing_key", "max_completion_tokens", *SAMPLING]
)  # fmt: skip
VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    "/v1/completions": {"prompt": "once upon", "max_tokens": 3},
    "/generate": {"text": "hello", "sampling_params": {"max_new_tokens": 3}},
}


@st.composite
def hostile_bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    """A path and a body: a valid body with a few hostile fields (in ``sampling_params``
    too), a body of hostile fields only, or any hostile value."""
    path = draw(paths)
    kind = draw(st.sampled_from(["valid+", "valid+", "fields", "any"]))
    if kind == "any":
        return path, render(draw(hostile_values))
    overrides = draw(st.dictionaries(hostile_fields, hostile_values, max_size=3))
    if kind == "fields":
        return path, render(overrides)
    body = {**VALID[path], **overrides}
    if path == "/generate" and draw(st.booleans()):
        params = draw(st.dictionaries(st.sampled_from(SAMPLING), hostile_values, max_size=2))
        body["sampling_params"] = {"max_new_tokens": 3, **params}
    return path, render(body)


def check_hostile(routers: tuple[str, str, str], path: str, data: bytes) -> int:
    """No 5xx (a healthy worker stands behind, so no 503 either), no leaked internals, a
    message on every error, and the same status from both fronts (returned); the worker
    itself, sent the same bytes, never answers 5xx either."""
    lean = _post(routers[0] + path, data)
    plain = _post(routers[1] + path, data)
    for status, text in (lean, plain, _post(routers[2] + path, data)):
        assert status < 500, (status, text[:300], data[:200])
        assert '"code": 500' not in text and "internal error" not in text, text[:300]
        if status >= 400:
            assert json.loads(text)["error"]["message"]
    assert lean[0] == plain[0], (lean[1][:200], plain[1][:200], data[:200])
    return lean[0]


@pytest.fixture(scope="module")
def routers() -> Iterator[tuple[str, str, str]]:
    with two_routers() as urls:
        yield urls


@contextlib.contextmanager
def two_routers() -> Iterator[tuple[str, str, str]]:
    """A worker and two routers in front of it (lean front, aiohttp only) on their own
    event loop in a thread, shared by all examples (and by ``tests/perf/fuzz_bodies.py``):
    the routers' URLs, then the worker's."""
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
        yield lean.url, plain.url, worker.url
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
def test_fuzzed_bodies_never_5xx(routers: tuple[str, str, str], path: str, body: Any) -> None:
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
    routers: tuple[str, str, str], path: str, body: Any, client: str
) -> None:
    data = json.dumps(body, allow_nan=True).encode()
    headers = {"X-Fairserve-Client": client} if client.isprintable() and client.isascii() else {}
    lean = _post(routers[0] + path, data, headers)
    plain = _post(routers[1] + path, data, headers)
    assert lean[0] == plain[0], (lean, plain)
    if lean[0] >= 400:
        assert json.loads(lean[1]) == json.loads(plain[1])


HOSTILE_CI_CASES = 500
"""The 10^4-case run is ``python tests/perf/fuzz_bodies.py`` (about 5 minutes here)."""


@settings(
    max_examples=HOSTILE_CI_CASES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=hostile_bodies())
def test_hostile_bodies_never_5xx(routers: tuple[str, str, str], case: tuple[str, bytes]) -> None:
    check_hostile(routers, *case)


def _post(url: str, data: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
