"""The pieces of a token radix tree (``core.radix``): nodes, owner matches, edge compare."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from fairserve.core.errors import ConfigError
from fairserve.core.types import TOKEN_BYTES

Owner = Hashable


class Node:
    """One compressed edge: ``edge`` holds the tokens from the parent to this node."""

    __slots__ = (
        "children",
        "edge",
        "ends",
        "in_lru",
        "inside",
        "last_access",
        "owners",
        "parent",
        "ref",
    )

    def __init__(self, edge: bytes, parent: Node | None) -> None:
        self.edge = edge
        self.parent = parent
        self.children: dict[bytes, Node] = {}
        self.owners: set[Owner] = set()
        self.ref = 0
        self.last_access = 0
        self.in_lru = False
        """The tree's LRU index holds an entry for this node (``core.radix_lru``)."""
        self.inside: dict[int, Ticket] | None = None
        """Tickets of the kept matches that end inside this edge, by the edge tokens they
        cover (``core.radix_matches``)."""
        self.ends: dict[bytes, Ticket] | None = None
        """Tickets of the kept matches that end where this edge ends, by the token the key
        goes on with (``b""``: the key ends here too)."""

    @property
    def tokens(self) -> int:
        return len(self.edge) // TOKEN_BYTES


class Ticket:
    """Shared by a node and the kept matches ending at one place of it
    (``core.radix_matches``): ``valid`` until the shape there changes, and meanwhile the
    match length, the node and the tokens of its edge the matches cover (0: all of it).

    The kept matches hold the ticket itself (one object to read per kept match: a decision
    over thousands of waiting requests reads one each). The node and its ticket refer to
    each other until the ticket is revoked, which every detach and split does."""

    __slots__ = ("node", "shared", "tokens", "valid")

    def __init__(self, tokens: int, node: Node, shared: int) -> None:
        self.valid = True
        self.tokens = tokens
        self.node: Node | None = node
        self.shared = shared

    def revoke(self) -> None:
        self.valid = False
        self.node = None


@dataclass(frozen=True, slots=True)
class OwnerMatch:
    """Longest prefix of a key held by any owner, and the owners that hold all of it."""

    tokens: int
    owners: frozenset[Owner]


def check_key(key: bytes) -> None:
    if len(key) % TOKEN_BYTES:
        raise ConfigError(f"token key length {len(key)} is not a multiple of {TOKEN_BYTES}")


def common_tokens(key: bytes, pos: int, edge: bytes) -> int:
    """Number of whole tokens shared by ``key[pos:]`` and ``edge`` (binary search on memcmp)."""
    lo, hi = 0, min(len(edge), len(key) - pos) // TOKEN_BYTES
    view = memoryview(edge)  # slices of a view are not copies; edges run to 16 KiB
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if key.startswith(view[: mid * TOKEN_BYTES], pos):
            lo = mid
        else:
            hi = mid - 1
    return lo


Walk = tuple[Node, int, "Node | None", int]
"""(deepest node on the key's path, bytes of the key it covers, the child the key runs
into part-way or None, tokens shared with that child)."""
