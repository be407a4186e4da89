"""The router-side fair queues: which workers get one, built with which policy, and the
fairness settings applied to them.

A worker that enforces no fairness itself (a stock engine: ``--router-queue auto``, or any
with ``on``) gets a :class:`~fairserve.router.fairqueue.FairQueue` when it comes up; live
weight and Q^u changes reach every queue (this is a
:class:`~fairserve.router.settings.FairnessSettings` listener).
"""

from __future__ import annotations

from collections.abc import Mapping

from fairserve.router.config import RouterConfig
from fairserve.router.fairqueue import DEFAULT_CACHE_TOKENS, FairQueue
from fairserve.router.settings import FairnessSettings
from fairserve.router.upstream import Upstream
from fairserve.sched.local.base import LocalPolicy, local_policy_class
from fairserve.sched.registry import make_local_policy

ROUTER_JUSTITIA_STEPS_PER_S = 30.0
"""Decode iterations per second the router assumes for Justitia's clock when none is given
(a 7-8B model's decode step on one GPU is some 20-40 ms)."""


def build_queue_policy(
    config: RouterConfig, weights: Mapping[str, float] | None = None
) -> LocalPolicy:
    """The router-side queue's policy; ``weights``: the live ones (``tune weight``)."""
    params = dict(config.policy_params)
    if config.quantum is not None:
        params["quantum"] = config.quantum
    declared = {param.name for param in local_policy_class(config.policy).params}
    if "clock" in declared and "clock" not in params:
        # The router's queue sees no decode iterations, only time: a policy whose clock can
        # count either runs on seconds times an iteration rate (steps_per_s: the engine's 1/c).
        params["clock"] = "seconds"
        params.setdefault("steps_per_s", ROUTER_JUSTITIA_STEPS_PER_S)
    live = config.weights if weights is None else weights
    return make_local_policy(config.policy, weights=live, **params)


class RouterQueues:
    """The fair queues of one router's workers."""

    def __init__(
        self, config: RouterConfig, settings: FairnessSettings, upstreams: Mapping[str, Upstream]
    ) -> None:
        self.config = config
        self.settings = settings
        self.upstreams = upstreams

    def listen(self) -> None:
        """Apply every weight and Q^u change to the queues."""
        self.settings.on_weight(self.set_weight)
        self.settings.on_quantum(self.set_quantum)

    def count(self) -> int:
        return sum(1 for up in self.upstreams.values() if up.queue is not None)

    def worker_up(self, up: Upstream) -> None:
        """Give a worker that came (back) up its queue, or take it away if the mode no
        longer wants one (only when nothing waits in it)."""
        mode = self.config.router_queue
        wants_queue = mode == "on" or (mode == "auto" and not up.extension)
        if wants_queue and up.queue is None:
            up.queue = FairQueue(
                build_queue_policy(self.config, self.settings.weights),
                self.config.max_outstanding_per_worker,
                up.max_total_tokens or DEFAULT_CACHE_TOKENS,
            )
            if self.settings.quantum is not None:
                up.queue.policy.set_quantum(self.settings.quantum)
        elif not wants_queue and up.queue is not None and up.queue.outstanding == 0:
            up.queue = None

    def set_weight(self, client: str, weight: float) -> None:
        for up in self.upstreams.values():
            if up.queue is not None:
                up.queue.policy.set_weight(client, weight)

    def set_quantum(self, quantum: float) -> None:
        build_queue_policy(self.config).set_quantum(quantum)  # refuses bad values first
        for up in self.upstreams.values():
            if up.queue is not None:
                up.queue.policy.set_quantum(quantum)
