"""Recently parsed HTTP heads, remembered by their bytes.

Why: parsing a head by :mod:`~fairserve.router.http11`'s strict rules costs 4-6 µs, and
over keep-alive connections the same bytes come again and again (a client's request heads
but for the body's length, a worker's answer heads within the second of their ``Date``).
The router's two parsers, the lean front's for requests and the framing's for answers, keep
their verdicts here under one rule: bounded in entries (all forgotten when full, which
costs less per hit than an LRU's bookkeeping) and in head size (longer heads are parsed
every time). Only verdicts are kept, never a head that broke a rule (its parser raises or
answers "not mine" each time).
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")

LENGTH_LINES = (b"\r\nContent-Length: ", b"\r\ncontent-length: ")
"""How clients and workers spell the line whose value :func:`without_length` leaves out."""
MAX_LENGTH_DIGITS = 18
"""``http11``'s limit on a Content-Length value."""


class HeadMemo(Generic[T]):
    """Head bytes → what they decide, at most ``entries`` heads of at most ``max_bytes``."""

    __slots__ = ("_by_head", "entries", "max_bytes")

    def __init__(self, entries: int, max_bytes: int) -> None:
        self.entries = entries
        self.max_bytes = max_bytes
        self._by_head: dict[bytes, T] = {}

    def get(self, head: bytes) -> T | None:
        return self._by_head.get(head)

    def remember(self, head: bytes, verdict: T) -> None:
        """Keep ``verdict`` for ``head`` unless the head is too long; forget all when full."""
        if len(head) > self.max_bytes:
            return
        if len(self._by_head) >= self.entries:
            self._by_head.clear()
        self._by_head[head] = verdict

    def clear(self) -> None:
        self._by_head.clear()

    def __contains__(self, head: object) -> bool:
        return head in self._by_head

    def __len__(self) -> int:
        return len(self._by_head)


def without_length(head: bytes, max_bytes: int) -> tuple[int, bytes | None]:
    """Where the Content-Length value starts in ``head`` and the head without it (a memo
    key that serves every body length), or ``(0, None)`` when the head is not one to
    remember that way: longer than ``max_bytes``, no such line in the usual spelling, or a
    value that is not plain digits within the limit (the strict parse decides those)."""
    if len(head) > max_bytes:
        return 0, None
    for line in LENGTH_LINES:
        at = head.find(line)
        if at >= 0:
            break
    else:
        return 0, None
    value_at = at + len(line)
    end = head.find(b"\r\n", value_at)
    if end < 0:
        end = len(head)
    if not (0 < end - value_at <= MAX_LENGTH_DIGITS and head[value_at:end].isdigit()):
        return 0, None
    return value_at, head[:value_at] + head[end:]
