"""What the router's prefix tree believes each worker caches, kept close to the truth.

Workers with the fairserve extension report their evictions (a feed the router polls every
``eviction_interval_s``); for the others the tree is bounded per worker by its KV capacity,
evicting LRU (approximate, as sglang-router's tree). A worker that comes (back) up has an
empty cache as far as the router can know. The router starts and stops the poll; this
module owns it and the bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import aiohttp

from fairserve.router.config import RouterConfig
from fairserve.router.fairqueue import DEFAULT_CACHE_TOKENS
from fairserve.router.upstream import Upstream, every, poll_evictions
from fairserve.sched.dispatch.base import Dispatcher

log = logging.getLogger("fairserve.router")

FED_TREE_SLACK = 2
"""A worker with an eviction feed may hold at most this many times its KV capacity in the
router's tree (see :meth:`WorkerCaches.bound_tree`)."""


class WorkerCaches:
    """The eviction poll and the per-worker tree bound. ``dispatcher()`` is read at each
    use: a test may wrap the router's dispatcher."""

    def __init__(
        self,
        config: RouterConfig,
        upstreams: Mapping[str, Upstream],
        dispatcher: Callable[[], Dispatcher],
    ) -> None:
        self.config = config
        self.upstreams = upstreams
        self.dispatcher = dispatcher
        self.session: aiohttp.ClientSession | None = None

    def start(self, session: aiohttp.ClientSession) -> asyncio.Task[None]:
        """Poll the feeds every ``eviction_interval_s`` (the router cancels the task)."""
        self.session = session
        return asyncio.create_task(every(self.config.eviction_interval_s, self.poll))

    def worker_up(self, up: Upstream) -> None:
        """A worker that comes (back) up has an empty cache as far as we can know."""
        self.dispatcher().on_evict(up.url, b"")

    async def poll(self) -> None:
        assert self.session is not None
        for up in list(self.upstreams.values()):
            if up.healthy and up.extension:
                try:
                    await poll_evictions(
                        self.session,
                        up,
                        self.dispatcher().on_evict,
                        self.config.health_timeout_s,
                        self.config.admin_token,
                    )
                except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                    log.debug("eviction poll of %s failed: %s", up.url, exc)

    def bound_tree(self, worker: str) -> None:
        """Approximate LRU bound of the global tree per worker: its KV capacity for a worker
        without an eviction feed; twice that for one with a feed, whose evictions keep the
        tree right except for prefixes the worker never cached (a request aborted while it
        waited), which no eviction will ever remove. A worker that reports no capacity (a
        stock engine) is bounded as its fair queue is, by ``DEFAULT_CACHE_TOKENS``: without
        a bound every distinct prompt stayed in the tree for good."""
        up = self.upstreams[worker]
        capacity = up.max_total_tokens or DEFAULT_CACHE_TOKENS
        limit = capacity * (FED_TREE_SLACK if up.extension else 1)
        # Kept by the fleet's cache model for every later record too: a worker's fair queue
        # records the prompts it releases, after their dispatch.
        self.dispatcher().prefixes.bound(worker, limit)
