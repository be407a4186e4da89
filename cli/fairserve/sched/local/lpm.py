"""Longest prefix match (SGLang's default): maximise prefix-cache reuse, no fairness."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter

from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy, MatchLen, register_local

_ARRIVAL = attrgetter("arrival_s")


def lpm_sorted(
    waiting: Sequence[Request],
    matches: Sequence[int],
    matched: Mapping[Request, int] | None = None,
) -> list[Request]:
    """Longest cached prefix first for match lengths already known.

    Same order (longest match first, then arrival, then queue position). Hosts keep their
    queue in arrival order, so usually one stable sort on the match length, keyed by a C
    method, is enough (``reverse`` keeps equal matches in queue order); otherwise sort
    plain tuples (comparisons still run in C). ``matched``, the same lengths by request
    when the caller has them, sorts the requests themselves (no index sort to map back)."""
    arrivals = list(map(_ARRIVAL, waiting))
    if arrivals == sorted(arrivals):  # in arrival order: one pass in C, no comparisons kept
        if matched is not None:
            return sorted(waiting, key=matched.__getitem__, reverse=True)
        ranked = sorted(range(len(waiting)), key=matches.__getitem__, reverse=True)
        return list(map(waiting.__getitem__, ranked))
    negated = [-m for m in matches]
    keys = sorted(zip(negated, arrivals, range(len(waiting)), strict=True))
    return [waiting[k[2]] for k in keys]


def lpm_order(waiting: Sequence[Request], match_len: MatchLen) -> list[Request]:
    """Longest cached prefix first; ties by arrival, then queue position (deterministic)."""
    return lpm_sorted(waiting, [match_len(r) for r in waiting])


@register_local
class LPM(LocalPolicy):
    """Sort the waiting queue by matched prefix length, admit in that order."""

    name = "lpm"
    description = "longest prefix match first (SGLang's default; best cache reuse, no fairness)"

    def order(self, waiting: Sequence[Request], match_len: MatchLen) -> list[Request]:
        return lpm_order(waiting, match_len)
