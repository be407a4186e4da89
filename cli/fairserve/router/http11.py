"""Strict HTTP/1.1 message heads and chunked bodies, sans I/O: the one set of parsing rules
for the router's lean front (request heads) and its upstream client (answer heads and
chunked bodies, ``router.framing``).

Why strict: two parsers that disagree about where a header ends are a request-smuggling
and identity-spoofing hole (a bare LF inside a value made ``X-Fairserve-Client: evil`` a
header for one parser and part of ``Host`` for the other). The rules are llhttp's strict
mode, which aiohttp's parser uses, so the lean front refuses exactly what the aiohttp path
refuses:

* lines end with CRLF: a bare CR or LF anywhere is an error, as is any control byte
  (NUL..US except HTAB, and DEL) in a value; obsolete line folding is an error;
* header names are RFC 9110 tokens (no spaces, no colon, nothing before the colon);
* ``Content-Length`` is digits only, at most once, never with ``Transfer-Encoding``;
  ``Transfer-Encoding`` must end in ``chunked``; headers that must be single (``Host``,
  ``Content-Type``... aiohttp's list) appear at most once; HTTP/1.1 requests need ``Host``;
* ``Connection`` is a comma-separated list of tokens, matched by equality;
* limits are aiohttp's defaults (:data:`MAX_FIELD_BYTES`, :data:`MAX_HEADERS`) and chunk-size
  lines are bounded, so no input grows a buffer without bound.

A violation raises :class:`HeadError` (a ``ValueError``). The front hands such a request to
aiohttp, which answers its own 400 (so both paths give the same status by construction);
the upstream client turns it into an ``UpstreamError``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from multidict import CIMultiDict

MAX_FIELD_BYTES = 8190
"""Longest request target, header value or chunk trailer line (aiohttp's ``max_line_size``
and ``max_field_size``)."""
MAX_HEADERS = 128
"""Most header lines in a head (aiohttp's ``max_headers``; more: 400)."""
MAX_CHUNK_LINE_BYTES = 1024
"""Longest chunk-size line, extensions included (a size needs at most 16 hex digits)."""

SINGLETON_HEADERS = frozenset(
    {
        b"content-length",
        b"content-location",
        b"content-range",
        b"content-type",
        b"etag",
        b"host",
        b"max-forwards",
        b"server",
        b"transfer-encoding",
        b"user-agent",
    }
)
"""Headers that may appear once (aiohttp's ``SINGLETON_HEADERS``: a second one is 400)."""

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_VALUE = rb"[\t\x20-\x7e\x80-\xff]*"
_FIELDS = re.compile(rb"(?:" + _TOKEN + rb":" + _VALUE + rb"\r\n)*")
"""A header block (each line CRLF-terminated): tokens, a colon, then value bytes only."""
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb") ([\x21-\x7e]+) HTTP/1\.([01])")
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9][0-9])(?: " + _VALUE + rb")?")
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:[ \t]*;" + _VALUE + rb")?")
_DIGITS = re.compile(rb"[0-9]{1,18}")


class HeadError(ValueError):
    """A head (or chunk framing) that breaks the rules; the message says which."""


class RequestHead:
    """A request head that passed every rule."""

    __slots__ = (
        "chunked",
        "content_length",
        "headers",
        "http10",
        "keep_alive",
        "method",
        "names",
        "target",
    )

    def __init__(
        self,
        method: bytes,
        target: bytes,
        http10: bool,
        fields: list[tuple[bytes, bytes]],
        framing: _Framing,
    ) -> None:
        self.method = method
        self.target = target
        self.http10 = http10
        self.names = frozenset([name for name, _ in fields])  # lists: faster than generators
        """Lower-case names of the headers present."""
        self.headers: CIMultiDict[str] = CIMultiDict(
            [
                (name.decode("ascii"), value.decode("utf-8", "surrogateescape"))
                for name, value in fields
            ]
        )
        self.content_length = framing.length
        self.chunked = framing.chunked
        self.keep_alive = framing.keep_alive(http10)


class ResponseHead:
    """An answer head that passed every rule."""

    __slots__ = ("chunked", "content_length", "content_type", "keep_alive", "status")

    def __init__(self, status: int, http10: bool, framing: _Framing, content_type: str) -> None:
        self.status = status
        self.content_length = framing.length
        self.chunked = framing.chunked
        self.keep_alive = framing.keep_alive(http10)
        self.content_type = content_type


class _Framing:
    """What the headers say about the body and the connection."""

    __slots__ = ("chunked", "close", "keep", "length")

    def __init__(self, fields: list[tuple[bytes, bytes]]) -> None:
        self.length: int | None = None
        self.chunked = False
        self.close = self.keep = False
        seen: set[bytes] = set()
        for name, value in fields:
            if name in SINGLETON_HEADERS:
                if name in seen:
                    raise HeadError(f"duplicate {name.decode()} header")
                seen.add(name)
            if name == b"content-length":
                if not _DIGITS.fullmatch(value):
                    raise HeadError(f"invalid Content-Length {value[:40]!r}")
                self.length = int(value)
            elif name == b"transfer-encoding":
                if tokens(value)[-1:] != [b"chunked"]:
                    raise HeadError(f"unsupported Transfer-Encoding {value[:40]!r}")
                self.chunked = True
            elif name == b"connection":
                listed = tokens(value)
                self.close |= b"close" in listed
                self.keep |= b"keep-alive" in listed
        if self.chunked and self.length is not None:
            raise HeadError("Content-Length together with Transfer-Encoding")

    def keep_alive(self, http10: bool) -> bool:
        """RFC 9112 §9.3: ``close`` ends it; HTTP/1.0 keeps it only when asked to."""
        return not self.close and (self.keep or not http10)


def tokens(value: bytes) -> list[bytes]:
    """A comma-separated header value as lower-case tokens (empty elements dropped)."""
    return [t for t in (part.strip(b" \t").lower() for part in value.split(b",")) if t]


def fields(block: bytes) -> list[tuple[bytes, bytes]]:
    """The (lower-case name, value) pairs of a header block (the lines after the start line,
    each ending with CRLF), values without surrounding whitespace."""
    if not _FIELDS.fullmatch(block):
        raise HeadError(_why_block_is_bad(block))
    lines = block.split(b"\r\n")
    lines.pop()  # after the last CRLF
    if len(lines) > MAX_HEADERS:
        raise HeadError(f"more than {MAX_HEADERS} headers")
    out = []
    for line in lines:
        name, _, value = line.partition(b":")
        value = value.strip(b" \t")
        if len(value) > MAX_FIELD_BYTES:
            raise HeadError(f"a header value is longer than {MAX_FIELD_BYTES} bytes")
        out.append((name.lower(), value))
    return out


def _why_block_is_bad(block: bytes) -> str:
    for line in block.split(b"\r\n"):
        if line[:1] in (b" ", b"\t"):
            return "obsolete line folding"
        name, sep, value = line.partition(b":")
        if line and not (sep and re.fullmatch(_TOKEN, name)):
            return f"invalid header name {name[:40]!r}"
        if line and not re.fullmatch(_VALUE, value):
            return f"invalid byte in the value of {name[:40]!r}"
    return "malformed header block"


def _split(head: bytes) -> tuple[bytes, bytes]:
    """The start line and the header block (CRLF-terminated lines) of a head given
    without its final empty line."""
    start, sep, rest = head.partition(b"\r\n")
    return start, rest + b"\r\n" if sep else b""


def parse_request_head(head: bytes) -> RequestHead:
    """A request head (the bytes before the empty line ending it) checked against every
    rule, or :class:`HeadError`."""
    start, block = _split(head)
    match = _REQUEST_LINE.fullmatch(start)
    if match is None:
        raise HeadError(f"malformed request line {start[:60]!r}")
    method, target, minor = match.groups()
    if len(target) > MAX_FIELD_BYTES:
        raise HeadError(f"request target longer than {MAX_FIELD_BYTES} bytes")
    pairs = fields(block)
    http10 = minor == b"0"
    request = RequestHead(method, target, http10, pairs, _Framing(pairs))
    if not http10 and b"host" not in request.names:
        raise HeadError("missing Host header")
    return request


def parse_response_head(head: bytes) -> ResponseHead:
    """An answer head (the bytes before the empty line ending it) checked against every
    rule, or :class:`HeadError`."""
    start, block = _split(head)
    match = _STATUS_LINE.fullmatch(start)
    if match is None:
        raise HeadError(f"bad status line {start[:60]!r}")
    pairs = fields(block)
    content_type = "application/json"
    for name, value in pairs:
        if name == b"content-type":
            content_type = value.decode("latin-1")
    status = int(match.group(2))
    return ResponseHead(status, match.group(1) == b"0", _Framing(pairs), content_type)


# ---------------------------------------------------------------------- chunked bodies
_SIZE, _DATA, _DATA_END, _TRAILER = 0, 1, 2, 3


class ChunkedDecoder:
    """Decodes a ``chunked`` body as its bytes arrive, in bounded memory: a size line or a
    trailer line longer than its limit, a size that is not hex, or chunk data not followed
    by CRLF raise :class:`HeadError`."""

    __slots__ = ("_raw", "_remaining", "_state", "_trailers")

    def __init__(self) -> None:
        self._state = _SIZE
        self._remaining = 0
        self._raw = b""
        self._trailers = 0

    def feed(self, data: bytes, emit: Callable[[bytes], None]) -> bytes | None:
        """Pass the body bytes in ``data`` to ``emit``; returns None while the body goes
        on, else the bytes after its end."""
        buf = self._raw + data if self._raw else data
        self._raw = b""
        pos, end = 0, len(buf)
        while pos < end:
            if self._state == _DATA:
                take = min(self._remaining, end - pos)
                emit(buf[pos : pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._state = _DATA_END
                continue
            if self._state == _DATA_END:
                if end - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise HeadError("chunk data not followed by CRLF")
                pos += 2
                self._state = _SIZE
                continue
            eol = buf.find(b"\r\n", pos)
            limit = MAX_CHUNK_LINE_BYTES if self._state == _SIZE else MAX_FIELD_BYTES
            if eol < 0:
                if end - pos > limit:
                    raise HeadError(f"chunk line longer than {limit} bytes")
                break
            if eol - pos > limit:
                raise HeadError(f"chunk line longer than {limit} bytes")
            line, pos = buf[pos:eol], eol + 2
            if self._state == _SIZE:
                self._size(line)
            elif not line:  # the empty line after the last chunk and any trailers
                return buf[pos:]
            else:
                self._trailer(line)
        self._raw = buf[pos:]
        return None

    def _size(self, line: bytes) -> None:
        match = _CHUNK_LINE.fullmatch(line)
        if match is None:
            raise HeadError(f"invalid chunk size line {line[:40]!r}")
        self._remaining = int(match.group(1), 16)
        self._state = _DATA if self._remaining else _TRAILER

    def _trailer(self, line: bytes) -> None:
        self._trailers += 1
        if self._trailers > MAX_HEADERS:
            raise HeadError(f"more than {MAX_HEADERS} chunk trailers")
        fields(line + b"\r\n")
