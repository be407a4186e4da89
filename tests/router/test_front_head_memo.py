"""The lean front remembers request heads apart from their Content-Length value
(``front_head.parse_head``): a head served from memory decides what a fresh parse by the rules
decides (route, headers, body length, HTTP/1.0, keep-alive, or "not served here"), whatever
its length and the body limit; a head the front does not serve is never remembered; and the
memory stays bounded."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDictProxy

from fairserve.router import front_head, http11
from fairserve.router.front_head import HEAD_MEMO_ENTRIES, HEAD_MEMO_MAX_BYTES, Head, parse_head


def _reference(head: bytes, start: int, max_body_bytes: int) -> Head | None:
    """``parse_head`` as it was before the memo (every head parsed by the rules)."""
    try:
        parsed = http11.parse_request_head(head)
    except http11.HeadError:
        return None
    if parsed.method != b"POST":
        return None
    path, query_sep, query = parsed.target.partition(b"?")
    route = front_head.ROUTES.get(path)
    if route is None or (query_sep and not front_head.QUERY.fullmatch(query)):
        return None
    length = parsed.content_length
    if (
        length is None
        or length > max_body_bytes
        or not parsed.names.isdisjoint(front_head.HAND_OVER)
    ):
        return None
    headers = CIMultiDictProxy(parsed.headers)
    return Head(route, headers, start, length, parsed.http10, parsed.keep_alive)


def _decided(head: Head | None) -> object:
    """What a parsed head decides; the headers but Content-Length (which the front leaves
    to the framing: one remembered head serves every length)."""
    if head is None:
        return None
    headers = sorted(
        (k.lower(), v) for k, v in head.headers.items() if k.lower() != "content-length"
    )
    return head.route, headers, head.start, head.body_end, head.http10, head.keep_alive


_LENGTHS = st.sampled_from(
    [b"0", b"17", b"17723", b"0017", b"999999999999999999", b"1234567890123456789", b"12x", b"",
     b" 17", b"17 ", b"-1"]
)  # fmt: skip
_LINES = st.one_of(
    st.sampled_from(
        [
            b"Host: 127.0.0.1:8000",
            b"Content-Type: application/json",
            b"X-Fairserve-Client: alice",
            b"x-fairserve-app: chat",
            b"Connection: close",
            b"Connection: keep-alive",
            b"Transfer-Encoding: chunked",
            b"Expect: 100-continue",
            b"X-Bad\x01: value",
            b" folded",
        ]
    ),
    st.builds(lambda name, value: name + value, st.sampled_from(
        [b"Content-Length: ", b"content-length: ", b"CONTENT-LENGTH: ", b"Content-Length:"]
    ), _LENGTHS),
)  # fmt: skip


def _head(method: bytes, path: bytes, version: int, lines: list[bytes], length: bytes) -> bytes:
    """A request head; ``length`` (a Content-Length line, or empty) goes in the middle."""
    lines = lines[: len(lines) // 2] + ([length] if length else []) + lines[len(lines) // 2 :]
    return b"\r\n".join([b"%b %b HTTP/1.%d" % (method, path, version), *lines])


_HEADS = st.builds(
    _head,
    st.sampled_from([b"POST", b"GET"]),
    st.sampled_from([b"/v1/completions", b"/v1/chat/completions", b"/generate?x=1", b"/other"]),
    st.sampled_from([0, 1]),
    st.lists(_LINES, max_size=4),
    st.sampled_from([b"Content-Length: 17723", b"content-length: 17723", b""]),
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    heads=st.lists(_HEADS, min_size=1, max_size=6),
    lengths=st.lists(
        st.sampled_from([b"0", b"5", b"17723", b"123456", b"0000000000000000005", b"12x", b"5 "]),
        min_size=1,
        max_size=3,
    ),
    limit=st.sampled_from([10, 20_000, 1 << 24]),
)
def test_a_remembered_head_decides_what_a_fresh_parse_decides(
    heads: list[bytes], lengths: list[bytes], limit: int
) -> None:
    front_head.served_by_head.clear()
    for head in heads + heads:  # the second time from memory, where it was remembered
        variants = [head] + [head.replace(b"ength: 17723", b"ength: " + n) for n in lengths]
        for variant in variants:
            start = len(variant) + 4
            assert _decided(parse_head(variant, start, limit)) == _decided(
                _reference(variant, start, limit)
            ), variant


def test_the_memory_is_bounded_and_unserved_or_long_heads_are_not_remembered() -> None:
    front_head.served_by_head.clear()
    base = b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nX-N: %d\r\nContent-Length: 5"
    for n in range(HEAD_MEMO_ENTRIES * 3):
        assert parse_head(base % n, 0, 100) is not None
        assert len(front_head.served_by_head) <= HEAD_MEMO_ENTRIES
    front_head.served_by_head.clear()
    assert parse_head(b"GET /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 5", 0, 9) is None
    long = b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nX-Pad: %b\r\nContent-Length: 5" % (
        b"a" * HEAD_MEMO_MAX_BYTES
    )
    assert parse_head(long, 0, 100) is not None
    assert not front_head.served_by_head


def test_one_remembered_head_serves_every_body_length() -> None:
    front_head.served_by_head.clear()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: %d"
    for length in (17723, 4, 17724, 99):
        parsed = parse_head(head % length, 10, 20_000)
        assert parsed is not None and parsed.body_end == 10 + length
        assert "Content-Length" not in parsed.headers
    assert len(front_head.served_by_head) == 1
    assert parse_head(head % 20_001, 10, 20_000) is None  # over the limit, remembered or not
