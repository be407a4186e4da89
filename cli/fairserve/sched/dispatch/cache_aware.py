"""Cache-aware dispatch (the Preble / sglang-router family): locality first, no fairness.

The fleet's cache model (``self.prefixes``, a
:class:`~fairserve.sched.dispatch.cache_model.CacheModel`) records which worker was sent
which prompt (owner = worker). When the
load is balanced and some worker holds at least ``cache_threshold`` of the prompt, the
request goes to the least loaded of the workers holding the longest match; otherwise to the
least loaded worker. "Balanced" follows sglang-router: the load is *imbalanced* only when
``max − min > balance_abs_threshold`` **and** ``max > balance_rel_threshold · min``
(outstanding requests). Its known failure — one replica keeps winning on cache hits and a
heavy client hogs it — is what DoubleQ's per-worker quantum answers.

``max_tree_tokens_per_worker`` bounds each worker's share of that model (DoubleQ too).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from fairserve.core.errors import ConfigError
from fairserve.core.types import Request
from fairserve.sched.dispatch.base import Dispatcher, register_dispatcher
from fairserve.sched.dispatch.cache_model import LRU_LOW_WATERMARK as LRU_LOW_WATERMARK
from fairserve.sched.dispatch.cache_model import CacheModel
from fairserve.sched.params import Param, Params, param

MAX_TREE_TOKENS = Param(
    "max_tree_tokens_per_worker",
    int,
    0,
    "approximate LRU bound on the tokens the global tree records per worker (0 = unbounded;"
    " use when workers report no evictions)",
    minimum=0,
)


@dataclass(frozen=True, slots=True)
class CacheAwareParams(Params):
    """sglang-router's thresholds and the global tree's bound."""

    cache_threshold: float = param(
        0.5,
        "exploit the cached worker when matched/input tokens is at least this (0..1)",
        minimum=0.0,
    )
    balance_abs_threshold: int = param(
        32,
        "load is imbalanced when max - min outstanding requests exceeds this (and the ratio test)",
        minimum=0,
    )
    balance_rel_threshold: float = param(
        1.5,
        "load is imbalanced when max > this x min outstanding requests (and the difference test)",
        minimum=1.0,
    )
    max_tree_tokens_per_worker: int = MAX_TREE_TOKENS.field()


@register_dispatcher
class CacheAware(Dispatcher):
    """Longest-match worker while the load is balanced, else the least loaded."""

    name = "cache-aware"
    description = "longest cached prefix while load is balanced (sglang-router cache_aware, unfair)"
    config: CacheAwareParams

    def _init_state(self) -> None:
        if self.config.cache_threshold > 1.0:
            raise ConfigError(
                f"dispatcher {self.name}: parameter 'cache_threshold' must be <= 1,"
                f" got {self.config.cache_threshold:g}"
            )
        self.prefixes = CacheModel(self.config.max_tree_tokens_per_worker)
        self.decisions = {"cache": 0, "balance": 0}

    def imbalanced(self, candidates: Sequence[str]) -> bool:
        """sglang-router's test: both the absolute and the relative spread are exceeded."""
        loads = [self.outstanding[w] for w in candidates]
        low, high = min(loads), max(loads)
        config = self.config
        return (
            high - low > config.balance_abs_threshold and high > config.balance_rel_threshold * low
        )

    def _choose(self, req: Request, candidates: list[str]) -> str:
        if not self.imbalanced(candidates) and req.input_tokens > 0:
            match = self.prefixes.match(req.prompt_key)
            if match.tokens / req.input_tokens >= self.config.cache_threshold:
                holders = [w for w in candidates if w in match.owners]
                if holders:
                    self.decisions["cache"] += 1
                    return self.least_outstanding(holders)
        self.decisions["balance"] += 1
        return self.least_outstanding(candidates)

    def _dispatched(self, req: Request, worker: str) -> None:
        self.prefixes.dispatched(req.prompt_key, worker)

    def _worker_state(self, worker: str) -> dict[str, Any]:
        return {"tree_tokens": self.prefixes.worker_tokens(worker)}

    def _extra_state(self, clients: Collection[str] | None) -> dict[str, Any]:
        return {"tree_tokens": self.prefixes.total_tokens, "decisions": dict(self.decisions)}
