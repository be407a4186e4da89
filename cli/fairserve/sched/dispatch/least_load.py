"""Least load: the worker with the fewest outstanding tokens.

Outstanding tokens (prompt + expected output of dispatched, unfinished requests) track the
work a worker still owes better than a request count when request sizes vary; ties go to
fewer outstanding requests, then to worker order, so decisions are deterministic.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from fairserve.core.types import Request
from fairserve.sched.dispatch.base import Dispatcher, register_dispatcher


@register_dispatcher
class LeastLoad(Dispatcher):
    """Fewest outstanding tokens, then fewest outstanding requests, then worker order."""

    name = "least-load"
    description = "send to the worker with the fewest outstanding tokens (load balance only)"

    def _choose(self, req: Request, candidates: list[str]) -> str:
        # ``candidates`` are in worker order and ``min`` keeps the first of equal keys.
        tokens, requests = self.outstanding_tokens, self.outstanding
        return min(candidates, key=lambda w: (tokens[w], requests[w]))

    def _extra_state(self, clients: Collection[str] | None) -> dict[str, Any]:
        return {"load_metric": "outstanding_tokens"}
