"""Longest prefix match (SGLang's default): maximise prefix-cache reuse, no fairness."""

from __future__ import annotations

from collections.abc import Sequence

from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy, MatchLen, register_local


def lpm_order(waiting: Sequence[Request], match_len: MatchLen) -> list[Request]:
    """Longest cached prefix first; ties by arrival (stable, deterministic)."""
    keyed = [(-match_len(r), r.arrival_s, i, r) for i, r in enumerate(waiting)]
    keyed.sort(key=lambda t: (t[0], t[1], t[2]))
    return [t[3] for t in keyed]


@register_local
class LPM(LocalPolicy):
    """Sort the waiting queue by matched prefix length, admit in that order."""

    name = "lpm"
    description = "longest prefix match first (SGLang's default; best cache reuse, no fairness)"

    def order(self, waiting: Sequence[Request], match_len: MatchLen) -> list[Request]:
        return lpm_order(waiting, match_len)
