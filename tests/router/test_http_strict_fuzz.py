"""Differential fuzzing of the router's front door (issue 18, "Must show"): for any bytes a
client sends, the lean front and the router with the front disabled (aiohttp only) give
the same first answer's status, or both give none (wait or close).

The bytes are raw, over a socket: requests assembled from parts that are each sometimes
wrong (methods, targets, versions, header names and values with control bytes, bare CR or
LF, obs-fold, duplicate or malformed Content-Length, Transfer-Encoding, Expect, missing
Host, line endings), plus arbitrary bytes. Derandomised, bounded in examples and time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.router.test_fuzz import two_routers
from tests.router.test_http_strict import exchange, status_of

WAIT_S = 1.5
"""How long a side may stay silent before its answer counts as none."""
BUDGET_S = 120.0
"""Wall time for all examples (about 6 s on a quiet 2-core machine); on a machine so slow
that it runs out, the remaining examples pass without being sent."""
_started_s: list[float] = []

_bytes_alphabet = st.sampled_from(
    [b"a", b"Z", b"0", b"9", b" ", b"\t", b"\r", b"\n", b"\r\n", b"\x00", b"\x01", b"\x7f",
     b"\xff", b"\xc3\xa9", b":", b",", b";", b"%", b"?", b"#", b"/", b'"', b"-", b"close",
     b"keep-alive", b"chunked", b"100-continue", b"+", b"x"]
)  # fmt: skip
junk = st.lists(_bytes_alphabet, max_size=6).map(b"".join)

bad_methods = st.sampled_from([b"GET", b"PUT", b"post", b"P@ST", b"POST "])
routes = st.sampled_from([b"/v1/completions", b"/v1/chat/completions", b"/generate"])
bad_targets = st.tuples(
    st.sampled_from([b"/v1/completions", b"/health", b"/nowhere", b"", b"*"]),
    st.sampled_from([b"?", b"#", b"//", b"", b"?a=1&b=%zz"]),
    junk,
).map(b"".join)
bad_versions = st.sampled_from([b"HTTP/1.2", b"http/1.1", b"HTTP/1.1 ", b"HTTP/2"])
names = st.sampled_from(
    [b"Host", b"host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"Expect",
     b"Content-Type", b"User-Agent", b"X-Fairserve-Client", b"X-A", b"X A", b"X(A)", b"",
     b" Host", b"Host "]
)  # fmt: skip
values = st.one_of(
    st.sampled_from([b"x", b"2", b"0", b"-1", b"+2", b"2, 2", b"chunked", b"close",
                     b"keep-alive", b"100-continue", b"application/json", b""]),
    junk,
)  # fmt: skip
separators = st.sampled_from([b": ", b":", b" : ", b":\t"])
line_ends = st.sampled_from([b"\r\n", b"\n", b"\r", b"\r\n "])
bad_lines = st.tuples(names, separators, values, line_ends).map(b"".join)
good_lines = st.sampled_from(
    [b"Content-Type: application/json\r\n", b"Connection: close\r\n",
     b"Connection: keep-alive\r\n", b"X-Fairserve-Client: team-a\r\n", b"Accept: */*\r\n",
     b"User-Agent: fuzz\r\n"]
)  # fmt: skip
BODIES = {
    b"/v1/completions": b'{"prompt": "a", "max_tokens": 1}',
    b"/v1/chat/completions": b'{"messages": [{"role": "user", "content": "a"}], "max_tokens": 1}',
    b"/generate": b'{"text": "a", "sampling_params": {"max_new_tokens": 1}}',
}
"""A body each route serves (200), so a refusal comes from the head."""


RARELY = st.sampled_from([True, False, False, False, False, False])
"""True one time in six (uniform, where integers() favour their bounds)."""


def _sometimes_bad(draw: st.DrawFn, good: bytes, bad: st.SearchStrategy[bytes]) -> bytes:
    """``good`` most of the time (so most requests break one rule, or none)."""
    return draw(bad) if draw(RARELY) else good


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """A request built from parts, each now and then wrong, with now and then a hostile
    header line; Content-Length matches the body unless a drawn header sets another."""
    method = _sometimes_bad(draw, b"POST", bad_methods)
    route = draw(routes)
    target = _sometimes_bad(draw, route, bad_targets)
    version = _sometimes_bad(draw, draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0"])), bad_versions)
    lines = draw(st.lists(good_lines, max_size=3, unique=True))
    if not draw(RARELY):
        lines.insert(0, b"Host: x\r\n")
    body = _sometimes_bad(draw, BODIES[route], st.sampled_from([b"{bad", b"{}", b""]))
    if not draw(RARELY):
        lines.append(b"Content-Length: %d\r\n" % len(body))
    for bad in draw(st.lists(bad_lines, max_size=2)) if draw(RARELY) else []:
        lines.insert(draw(st.integers(0, len(lines))), bad)
    return method + b" " + target + b" " + version + b"\r\n" + b"".join(lines) + b"\r\n" + body


raw_bytes = st.one_of(requests(), requests(), requests(), st.binary(max_size=64))


@pytest.fixture(scope="module")
def routers() -> Iterator[tuple[str, str]]:
    """The body fuzz's worker and two routers (lean front; aiohttp only), shared by all
    examples."""
    with two_routers() as (lean, plain, _):
        yield lean, plain


async def _both(urls: tuple[str, str], data: bytes) -> tuple[bytes, bytes]:
    lean, plain = await asyncio.gather(
        exchange(urls[0], data, wait_s=WAIT_S), exchange(urls[1], data, wait_s=WAIT_S)
    )
    return lean, plain


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=raw_bytes)
def test_lean_front_and_aiohttp_answer_any_bytes_alike(
    routers: tuple[str, str], data: bytes
) -> None:
    if not _started_s:
        _started_s.append(time.monotonic())
    if time.monotonic() - _started_s[0] > BUDGET_S:
        return
    lean, plain = asyncio.run(_both(routers, data))
    event(f"status {status_of(plain)}")
    assert status_of(lean) == status_of(plain), (data, lean[:300], plain[:300])
