"""The lean front's request heads: which ones it serves, and what each decides.

A head the front serves is a ``POST`` to a generation route with a plain query, a
``Content-Length`` and no ``Transfer-Encoding``, ``Expect`` or ``Upgrade``, that passes
:mod:`~fairserve.router.http11`'s strict rules; any other is handed to aiohttp, which
answers as it always did (so both paths refuse the same bytes alike). Verdicts are
remembered apart from the Content-Length value (:mod:`~fairserve.router.head_memo`): a
client sends the same head again and again but for its body's length, and no rule's verdict
depends on that value beyond its being 1 to 18 digits.
"""

from __future__ import annotations

import re

from multidict import CIMultiDictProxy

from fairserve.api import paths
from fairserve.core.openai_api import Route
from fairserve.router import http11
from fairserve.router.head_memo import HeadMemo, without_length

ROUTES: dict[bytes, Route] = {path.encode(): route for route, path in paths.GENERATION.items()}
HAND_OVER = frozenset((b"transfer-encoding", b"expect", b"upgrade"))
"""Request header names whose request the front hands to aiohttp."""
QUERY = re.compile(rb"[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*")
"""Query strings the front serves (RFC 3986 query characters); others go to aiohttp."""

HEAD_MEMO_ENTRIES = 256
"""Request heads remembered, Content-Length aside (all forgotten when full)."""
HEAD_MEMO_MAX_BYTES = 2048
"""Longer heads are parsed every time."""

Served = tuple[Route, CIMultiDictProxy[str], bool, bool]
"""What a head the front serves decides, its body length aside: route, headers (without
Content-Length), HTTP/1.0, keep-alive."""
served_by_head: HeadMemo[Served] = HeadMemo(HEAD_MEMO_ENTRIES, HEAD_MEMO_MAX_BYTES)
"""Recent request heads without their Content-Length value -> what they decide. Heads the
front does not serve are never remembered."""


class Head:
    """A parsed request head the front serves."""

    __slots__ = ("body_end", "headers", "http10", "keep_alive", "route", "start")

    def __init__(
        self,
        route: Route,
        headers: CIMultiDictProxy[str],
        start: int,
        length: int,
        http10: bool,
        keep_alive: bool,
    ) -> None:
        self.route = route
        self.headers = headers
        self.start = start
        self.body_end = start + length
        self.http10 = http10
        self.keep_alive = keep_alive


def parse_head(head: bytes, start: int, max_body_bytes: int) -> Head | None:
    """The request head if the front serves it, else None (aiohttp will: a head that breaks
    :mod:`~fairserve.router.http11`'s rules gets aiohttp's 400, so both paths refuse
    alike). Remembered apart from its Content-Length value (:data:`served_by_head`)."""
    length_at, key = without_length(head, HEAD_MEMO_MAX_BYTES)
    served = served_by_head.get(key) if key is not None else None
    if served is not None:
        assert key is not None
        length = int(head[length_at : length_at + len(head) - len(key)])
    else:
        served_length = _parse_fresh(head)
        if served_length is None:
            return None
        served, length = served_length
        if key is not None:
            served_by_head.remember(key, served)
    if length > max_body_bytes:
        return None
    route, headers, http10, keep_alive = served
    return Head(route, headers, start, length, http10, keep_alive)


def _parse_fresh(head: bytes) -> tuple[Served, int] | None:
    """What ``head`` decides by the rules, and its body length; None if the front does not
    serve it (whatever the limit on bodies, which the caller applies)."""
    try:
        parsed = http11.parse_request_head(head)
    except http11.HeadError:
        return None
    if parsed.method != b"POST":
        return None
    path, query_sep, query = parsed.target.partition(b"?")
    route = ROUTES.get(path)
    if route is None or (query_sep and not QUERY.fullmatch(query)):
        return None
    length = parsed.content_length
    if length is None or not parsed.names.isdisjoint(HAND_OVER):
        return None
    headers = parsed.headers
    headers.popall("Content-Length")  # the framing's; one remembered head serves every length
    return (route, CIMultiDictProxy(headers), parsed.http10, parsed.keep_alive), length
