"""Each waiting request's prefix match in SGLang's radix tree, kept across batching steps.

Why (issue 23): the policy's decision needs every waiting request's match length at every
batching step. SGLang matches the waiting queue itself only up to 128 waiting requests
(``SchedulePolicy._determine_active_policy`` turns LPM into FCFS above
``WAITING_QUEUE_PREFIX_MATCH_MAX``, and its Python tree core does not claim
``supports_fast_match_prefix``), so above that ``Req.prefix_len`` is whatever an earlier
match left, and matching every request again at every step costs a tree walk per request.
A step changes the tree only along a few paths (the prompts admitted, the leaves evicted),
so here a match is kept and re-walked only where the tree changed *where that match ends*.

The signal, read from SGLang's own nodes (``UnifiedTreeNode``: ``children``, ``key``,
``parent``; the tree core's id map ``_node_arena``, behind ``node_by_id``) at each use,
with no hook on the tree: a match ends

* where the edge of a node ``N`` ends, the request's key going on with child key ``h``
  (or ending there): it is unchanged while ``N`` is in the tree and has no child under
  ``h``. An insert can lengthen it only by adding that child; a split of ``N`` keeps
  ``N`` as the lower part (``_split_node``), so its end stays where it was;
* part-way along the edge of a node ``C`` below ``P``: unchanged while ``C`` is in the
  tree and ``C.parent`` is still ``P``. An insert that follows the request's key further
  must split ``C`` there, and any split of ``C`` puts a new node between ``P`` and ``C``
  (``C`` keeps the lower part of its edge).

"In the tree" is ``_node_arena.get(node.id) is node``: SGLang unlinks only leaves
(``_remove_leaf_from_parent``, which also drops the node from that id map; node ids are
never reused), so a node still in it has its whole path in the tree. ``evicted`` alone does
not tell: a deleted device leaf keeps its value field (``FullComponent.evict_component``
defers clearing it). ``reset`` builds a new root, and every kept match is dropped. When the
signal says a match may have moved, the walk resumes from the deepest node still known to
be on the path (``N``, or ``P``), else from the root.

Reading the signal per request still cost ~1.5 µs per waiting request and decision (15 ms
at 10,000 waiting). So the kept matches are also grouped by where they end, and
:meth:`KeptMatches.stale` reads the signal per group: the matches ending inside ``C``'s
edge all move or stay together; those ending at ``N``'s edge end stay while ``N`` is in
the tree and none of the child keys added under ``N`` since the last look (a set
difference in C) is a member's ``h``. The host then asks only about those, the new and
the retracted requests (``tests/sglang_real/test_matches.py`` checks every held answer
against SGLang's own matching after random tree changes).

The walk mirrors ``UnifiedTreeCore._match_prefix_helper`` with the key
``calc_priority`` matches (``origin_input_ids + output_ids``, ``extra_key``,
``cache_salt``, page-aligned) but reads only: no split, no LRU touch, so SGLang's cache
behaves as without the plugin. The shape where that equivalence is checked
(``tests/sglang_real/test_matches.py``) is the only one kept matches are used in: a
``UnifiedRadixCache`` with the Python tree core, the full-attention component only, no
hierarchical cache, no external linker, no EAGLE bigram keys, and requests without a
streaming session. Elsewhere (SWA or Mamba models, HiCache, the Rust tree core) the host
uses ``Req.prefix_len`` as SGLang's last match left it, as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

CACHE_CLASS = "UnifiedRadixCache"
TREE_CORE_CLASS = "UnifiedTreeCore"
"""The classes whose shape the walk mirrors (checked by name: SGLang is never imported
here, and a subclass may match differently)."""
FORCE_MISS_ENV = "SGLANG_RADIX_FORCE_MISS"
SWEEP_SLACK = 64
"""Matches that may leave their groups between two sweeps of the empty groups, besides
one per kept match (a sweep reads every group: amortised O(1) per leave)."""
"""SGLang's switch that makes every match empty (then ``prefix_len`` is used)."""


class _Kept:
    """One request's kept match: ``length`` tokens, ending where ``node``'s edge ends
    (``parent`` None; ``head``: the key's next child key, None where the key ends) or
    part-way along ``node``'s edge below ``parent``, whose own edge ends at
    ``parent_length``. The key itself is not kept (a copy of every waiting prompt): it is
    built again for a walk, which reads it whole anyway."""

    __slots__ = ("group", "head", "length", "node", "parent", "parent_length", "tokens")

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.length = 0
        self.node: Any = None
        self.head: Any = None
        self.parent: Any = None
        self.parent_length = 0
        self.group: dict[str, _Kept] | None = None
        """The member table of the group it is registered in (see :meth:`KeptMatches.stale`)."""


class _EndGroup:
    """Kept matches ending where ``node``'s edge ends, by the key's next child key
    (``head``; None where the key ends there). Such a match stays while ``node`` is in the
    tree and has no child under its head, so only a child added under a member's head
    moves it: ``keys`` are ``node``'s child keys when the members were last known right."""

    __slots__ = ("by_head", "keys", "node")

    def __init__(self, node: Any) -> None:
        self.node = node
        self.keys: set[Any] = set(node.children)
        self.by_head: dict[Any, dict[str, _Kept]] = {}


class _InsideGroup:
    """Kept matches ending part-way along ``node``'s edge, below ``parent``: they stay
    while ``node`` is in the tree, not evicted, and still below ``parent``."""

    __slots__ = ("members", "node", "parent")

    def __init__(self, node: Any, parent: Any) -> None:
        self.node = node
        self.parent = parent
        self.members: dict[str, _Kept] = {}


class KeptMatches:
    """Match lengths of the waiting requests of one scheduler, by rid, kept between
    decisions; ``keep=False`` walks every match from the root at every use (the cost
    without kept matches, for tests and ``tests/perf/bench_sglang_plugin.py``)."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.kept: dict[str, _Kept] = {}
        self._next: dict[str, _Kept] = {}
        self._root: Any = None
        self._core: Any = None
        self._key_type: Any = None
        self._arena: dict[Any, Any] = {}
        self._ends: dict[Any, _EndGroup] = {}
        """Node (hashed by identity) -> the kept matches ending where its edge ends."""
        self._inside: dict[Any, _InsideGroup] = {}
        """Node -> the kept matches ending inside its edge."""
        self._fragile: dict[str, _Kept] = {}
        """Kept matches the groups cannot vouch for (they stop before a child that is
        there but evicted): checked again at every decision."""
        self._dropped: list[str] = []
        """Requests whose kept match a reset of the tree dropped."""
        self._left = 0
        """Matches that left a group since empty groups were last swept out."""
        self.walks = 0
        """Matches walked (from the root or resumed below it) since creation."""
        self.reused = 0
        """Matches answered from a kept one without a walk since creation (with
        :meth:`stale`: also those its groups vouched for, which nobody asks about)."""

    def begin(self, cache: Any) -> Callable[[Any], int | None] | None:
        """Start a decision over ``cache``: the function giving a waiting request's match
        length (None for a request it cannot match: use ``prefix_len``), or None when the
        cache is not of the shape the walk mirrors. Requests not asked about before
        :meth:`end` are forgotten."""
        core = _supported_core(cache)
        if core is None:
            self._clear()
            return None
        if core is not self._core or core.root_node is not self._root:
            self._clear()  # another tree, or SGLang's reset: every node is gone
            self._core, self._root = core, core.root_node
            self._key_type = type(core.root_node.key)
            self._arena = core._node_arena
        self._next = {}
        return self.length

    def end(self) -> None:
        """The decision asked about every waiting request: keep only theirs."""
        for rid in self.kept.keys() - self._next.keys():
            self.forget(rid)
        self._next = {}

    def stale(self) -> list[str]:
        """After :meth:`begin`: the requests whose kept match may have moved since they
        were last asked about (or was dropped); a caller that asks about these (and the
        requests it never asked about) and keeps the other answers has every match as
        :meth:`length` would give it now, without one dict lookup per waiting request.

        The groups are checked, not the members: a group of matches ending at a node's
        edge end is vouched for while the node is in the tree and no child was added
        under a member's head (its child keys compared in C); a group ending inside an
        edge while the edge's node is in the tree, not evicted, below the same parent.
        With ``keep=False`` every kept request is stale."""
        out, self._dropped = self._dropped, []
        if not self.keep:
            out.extend(self.kept)
            return out
        out.extend(_detach(self._fragile))
        self._fragile = {}
        in_tree = self._in_tree
        for key, end in list(self._ends.items()):
            node = end.node
            if not in_tree(node):
                for members in end.by_head.values():
                    out.extend(_detach(members))
                del self._ends[key]
                continue
            children = node.children
            if children.keys() == end.keys:
                continue
            added = children.keys() - end.keys
            end.keys = set(children)
            by_head = end.by_head
            for head in added:
                if head in by_head:
                    out.extend(_detach(by_head.pop(head)))
            if not by_head:
                del self._ends[key]
        for key, inside in list(self._inside.items()):
            node = inside.node
            if node.parent is not inside.parent or node.evicted or not in_tree(node):
                out.extend(_detach(inside.members))
                del self._inside[key]
        self.reused += max(0, len(self.kept) - len(out))  # vouched for: nothing to read
        return out

    def forget(self, rid: str) -> None:
        """``rid`` left the waiting queue (or came back with outputs)."""
        kept = self.kept.pop(rid, None)
        if kept is not None:
            self._leave(rid, kept)

    def _leave(self, rid: str, kept: _Kept) -> None:
        group = kept.group
        if group is None:
            return
        group.pop(rid, None)
        kept.group = None
        self._left += 1
        if self._left > len(self.kept) + SWEEP_SLACK:
            self._sweep()

    def _sweep(self) -> None:
        """Drop the groups (and heads) whose members all left."""
        self._left = 0
        for key, end in list(self._ends.items()):
            end.by_head = {head: group for head, group in end.by_head.items() if group}
            if not end.by_head:
                del self._ends[key]
        self._inside = {key: inside for key, inside in self._inside.items() if inside.members}

    def _clear(self) -> None:
        self._dropped.extend(self.kept)
        self.kept.clear()
        self._ends.clear()
        self._inside.clear()
        self._fragile.clear()

    def length(self, sreq: Any) -> int | None:
        """``sreq``'s match length now (kept, or walked where the tree changed)."""
        if getattr(sreq, "session", None) is not None:
            return None  # a streaming session matches through its slot, not the tree
        rid = sreq.rid
        tokens = len(sreq.origin_input_ids) + len(sreq.output_ids)
        kept = self.kept.get(rid)
        if kept is None or kept.tokens != tokens or not self.keep:
            if kept is not None:
                self.forget(rid)
            kept = _Kept(tokens)
            self._walk(kept, sreq, self._root, 0)
        else:
            self._check(kept, sreq)
        self.kept[rid] = self._next[rid] = kept
        if self.keep:
            self._register(rid, kept)
        return kept.length

    def _register(self, rid: str, kept: _Kept) -> None:
        """File ``kept`` in the group that vouches for it (see :meth:`stale`)."""
        group = self._group_for(kept)
        if group is kept.group:
            return
        self._leave(rid, kept)
        group[rid] = kept
        kept.group = group

    def _group_for(self, kept: _Kept) -> dict[str, _Kept]:
        """The member table of the group ``kept`` belongs in now."""
        node = kept.node
        if kept.parent is not None:
            inside = self._inside.get(node)
            if inside is None or inside.parent is not kept.parent:
                if inside is not None:  # moved since :meth:`stale` last looked
                    self._dropped.extend(_detach(inside.members))
                inside = self._inside[node] = _InsideGroup(node, kept.parent)
            return inside.members
        head = kept.head
        end = self._ends.get(node)
        if end is None:
            end = self._ends[node] = _EndGroup(node)
        if head is not None and (head in node.children or head in end.keys):
            # A child there but evicted, or one that left since the group's keys were
            # read: the keys cannot tell when it comes back. Checked at every decision.
            return self._fragile
        group = end.by_head.get(head)
        if group is None:
            group = end.by_head[head] = {}
        return group

    def _key(self, sreq: Any) -> Any:
        """The key ``calc_priority`` matches (``match_kv_cache`` with
        ``origin_input_ids + output_ids``), page-aligned as the tree core aligns it."""
        origin, output = sreq.origin_input_ids, sreq.output_ids
        key = self._key_type(
            origin + output if len(output) else origin, getattr(sreq, "extra_key", None),
            cache_salt=getattr(sreq, "cache_salt", None),
        )  # fmt: skip
        return key.page_aligned(self._core.page_size)

    def _check(self, kept: _Kept, sreq: Any) -> None:
        """Keep ``kept`` if the tree did not change where it ends, else walk again from
        the deepest node known to be on its path."""
        node, parent = kept.node, kept.parent
        if parent is None:  # ends where node's edge ends
            if self._in_tree(node):
                head = kept.head
                if head is not None:
                    child = node.children.get(head)
                    if child is not None and not (child.evicted and not child.backuped):
                        self._walk(kept, sreq, node, kept.length)
                        return
                self.reused += 1
                return
        else:  # ends inside node's edge
            if node.parent is parent and not node.evicted and self._in_tree(node):
                self.reused += 1
                return
            if self._in_tree(parent):
                self._walk(kept, sreq, parent, kept.parent_length)
                return
        self._walk(kept, sreq, self._root, 0)

    def _in_tree(self, node: Any) -> bool:
        """Whether ``node`` is still linked into the tree (so is its whole path: SGLang
        unlinks leaves only, ``_remove_leaf_from_parent``, which also drops the node from
        the tree core's id map behind ``node_by_id``; a deleted device leaf keeps its KV
        value field, so ``evicted`` alone does not tell). The map is read directly: one
        dict lookup per kept match and step, where ``node_by_id`` raises for a gone id."""
        return node is self._root or self._arena.get(node.id) is node

    def _walk(self, kept: _Kept, sreq: Any, node: Any, offset: int) -> None:
        """SGLang's match walk, read-only, from ``node`` whose edge ends at ``offset``."""
        self.walks += 1
        key, page = self._key(sreq), self._core.page_size
        size = len(key)
        while offset < size:
            head = key.child_key_at(offset, page)
            child = node.children.get(head)
            if child is None or (child.evicted and not child.backuped):
                break
            matched = child.key.match_at(key, offset, page_size=page)
            if matched < len(child.key):
                kept.length, kept.node, kept.head = offset + matched, child, None
                kept.parent, kept.parent_length = node, offset
                return
            node = child
            offset += matched
        else:
            head = None
        kept.length, kept.node, kept.head = offset, node, head
        kept.parent, kept.parent_length = None, 0


def _detach(members: dict[str, _Kept]) -> list[str]:
    """The rids of ``members``, no longer in any group (kept: a walk resumes from them)."""
    for kept in members.values():
        kept.group = None
    return list(members)


def _supported_core(cache: Any) -> Any:
    """``cache``'s tree core when the walk above mirrors its matching exactly, else None."""
    if cache is None or type(cache).__name__ != CACHE_CLASS or getattr(cache, "disable", True):
        return None
    if getattr(cache, "linker", None) is not None:
        return None
    if os.environ.get(FORCE_MISS_ENV, "").strip().lower() not in ("", "0", "false"):
        return None
    core = getattr(cache, "tree_core", None)
    if core is None or type(core).__name__ != TREE_CORE_CLASS:
        return None
    if core.enable_hicache or core.is_eagle or len(core.components) != 1:
        return None
    if type(core.components[0]).__name__ != "FullComponent":
        return None
    return core
