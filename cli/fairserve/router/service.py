"""The router's long-lived state: the request lifecycle and what it feeds, and the jobs it
starts and stops.

One :class:`Router` per server. HTTP handlers (``handlers``) and the proxy (``proxy``) call
into it; it never touches aiohttp's server side, so it is the part ``launch`` and tests can
drive directly. It keeps the lifecycle only: health checks and ejection
(:mod:`~fairserve.router.health_loop`), the eviction poll and tree bound
(:mod:`~fairserve.router.caches`), the router-side queues (:mod:`~fairserve.router.queues`)
and the pushes of weights and quanta to workers (:mod:`~fairserve.router.pushes`) each own
their logic and state; the router builds, starts and stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Collection
from typing import IO, Any

import aiohttp

from fairserve.core.errors import ConfigError
from fairserve.core.openai_api import ApiError
from fairserve.router import persist
from fairserve.router.accounting import PRUNE_VISITS, Accounting
from fairserve.router.caches import FED_TREE_SLACK as FED_TREE_SLACK
from fairserve.router.caches import WorkerCaches
from fairserve.router.config import RouterConfig
from fairserve.router.feeds import LedgerFeed, TraceFeed, WorkerFeed
from fairserve.router.health_loop import HealthLoop
from fairserve.router.lifecycle import Lifecycle
from fairserve.router.metrics import RouterMetrics
from fairserve.router.pushes import WorkerPushes
from fairserve.router.queues import ROUTER_JUSTITIA_STEPS_PER_S as ROUTER_JUSTITIA_STEPS_PER_S
from fairserve.router.queues import RouterQueues
from fairserve.router.queues import build_queue_policy as build_queue_policy
from fairserve.router.settings import FairnessSettings, default_quantum
from fairserve.router.slots import WorkerSlots
from fairserve.router.upstream import Upstream, every
from fairserve.sched.dispatch.base import Dispatcher
from fairserve.sched.local.base import local_policy_class
from fairserve.sched.registry import load_all, make_dispatcher
from fairserve.workloads.trace import TraceWriter, open_for_recording

log = logging.getLogger("fairserve.router")


def build_dispatcher(config: RouterConfig, workers: Collection[str]) -> Dispatcher:
    """The dispatcher by name, with ``--worker-quantum`` where it takes one."""
    load_all()
    params = dict(config.dispatch_params)
    if config.worker_quantum is not None:
        params["worker_quantum"] = config.worker_quantum
    try:
        return make_dispatcher(config.dispatch, workers, weights=config.weights, **params)
    except ConfigError as exc:
        if config.worker_quantum is not None and "worker_quantum" in str(exc):
            raise ConfigError(
                f"--worker-quantum: dispatcher {config.dispatch} has no per-worker quantum"
            ) from None
        raise


def check_policy(config: RouterConfig) -> None:
    """Fail at startup for a bad ``--policy``/``--quantum`` (not at the first stock worker)."""
    load_all()
    declared = {p.name for p in local_policy_class(config.policy).params}
    if config.quantum is not None and "quantum" not in declared:
        raise ConfigError(f"--quantum: policy {config.policy} has no quantum")
    build_queue_policy(config)


class Router:
    """Dispatcher, upstream pool, accounting and metrics of one router."""

    def __init__(self, config: RouterConfig) -> None:
        check_policy(config)
        self.config = config
        self.dispatcher = build_dispatcher(config, config.worker_urls)
        self.accounting = Accounting(
            config.weights, config.w_e, config.w_q, labels=config.metrics_max_clients
        )
        self.metrics = RouterMetrics(self.accounting)
        """Read from the accounting at scrape time (it keeps the counters' totals)."""
        self.lifecycle = Lifecycle([LedgerFeed(self.accounting), WorkerFeed(self)])
        """Every request's events reach the ledger and the workers through here."""
        self.upstreams = {
            url: Upstream(url, extension_url=config.extension_urls.get(url))
            for url in config.worker_urls
        }
        self.settings = self._settings()
        """The one owner of weights and quanta (see ``router.settings``)."""
        self.slots = WorkerSlots(self._running_bound)
        """Requests let into each worker and the ones waiting for room (``router.slots``)."""
        self.lifecycle.subscribe(self.slots)
        self.queues = RouterQueues(config, self.settings, self.upstreams)
        self.queues.listen()
        self.pushes = WorkerPushes(
            self.settings, self.upstreams, config.health_timeout_s, config.admin_token, self.spawn
        )
        self.caches = WorkerCaches(config, self.upstreams, lambda: self.dispatcher)
        self.health = HealthLoop(
            config, self.upstreams, [self.caches.worker_up, self.queues.worker_up,
                                     self.pushes.worker_up],
        )  # fmt: skip
        self.settings_file = persist.SettingsFile(config.settings_path)
        self.settings_file.restore(
            self.settings, config.quantum is not None, config.worker_quantum is not None
        )
        self.session: aiohttp.ClientSession | None = None
        self.draining = False
        self.active = 0
        self.started_s = time.monotonic()
        self._tasks: list[asyncio.Task[None]] = []
        self._side_tasks: set[asyncio.Task[Any]] = set()
        self._trace_file: IO[str] | None = None
        self.trace: TraceWriter | None = None
        self._trace_feed: TraceFeed | None = None
        self.idle = asyncio.Event()
        self.idle.set()

    # ------------------------------------------------------------------ fairness settings
    def _running_bound(self, worker: str) -> int | None:
        """A worker's running bound as it reported it (None: unknown, or not one of ours)."""
        up = self.upstreams.get(worker)
        return None if up is None else up.running_bound

    def _settings(self) -> FairnessSettings:
        """The settings and who applies them: the dispatcher (read at each change: a test
        may wrap it), the accounting, then the router-side queues (``RouterQueues.listen``)."""
        config = self.config
        settings = FairnessSettings(
            config.weights,
            config.quantum,
            self.dispatcher.quantum,
            getattr(build_queue_policy(config), "quantum", None),
            default_quantum(config.policy),
        )
        settings.on_weight(lambda client, weight: self.dispatcher.set_weight(client, weight))
        settings.on_weight(self.accounting.set_weight)  # never creates a client
        settings.on_worker_quantum(lambda quantum: self.dispatcher.set_quantum(quantum))
        return settings

    @property
    def weights(self) -> dict[str, float]:
        return self.settings.weights

    @property
    def live_weights(self) -> dict[str, float]:
        return self.settings.live_weights

    @property
    def local_quantum(self) -> float | None:
        return self.settings.quantum

    @property
    def worker_quanta(self) -> dict[str, float | None]:
        return self.settings.worker_quanta

    def _save(self) -> None:
        self.settings_file.save(self.settings)

    def settings_view(self) -> dict[str, Any]:
        """Where the fairness settings came from, for the state and ``status``."""
        return {**self.settings_file.view(), **self.settings.view()}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        cfg = self.config
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=cfg.request_timeout_s, sock_connect=cfg.connect_timeout_s
            ),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self.pushes.start(self.session, self.health.start(self.session))
        if cfg.trace_path is not None:
            self._trace_file, kept = open_for_recording(cfg.trace_path)
            if kept is not None:
                log.warning(
                    "--record: the previous trace at %s is kept as %s", cfg.trace_path, kept
                )
            self.trace = TraceWriter(self._trace_file)
            self._trace_feed = TraceFeed(self.trace, self.started_s)
            self.lifecycle.subscribe(self._trace_feed)
        await self.check_health()
        self.accounting.sample(time.monotonic())
        self._tasks = [
            self.health.task(),
            self.caches.start(self.session),
            asyncio.create_task(every(cfg.sample_interval_s, self._sample)),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._side_tasks:
            await asyncio.wait(self._side_tasks, timeout=1.0)
        if self.session is not None:
            await self.session.close()
            self.session = None
        self.pushes.stop()
        if self._trace_feed is not None:
            self.lifecycle.unsubscribe(self._trace_feed)
            self._trace_feed = None
        if self._trace_file is not None:
            self._trace_file.close()
            self._trace_file = None

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests and wait for in-flight ones (True when all finished)."""
        self.draining = True
        try:
            await asyncio.wait_for(self.idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def enter(self) -> None:
        self.active += 1
        self.idle.clear()

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.idle.set()

    def spawn(self, coro: Any) -> None:
        """A fire-and-forget job (upstream aborts) that ``close`` waits for briefly."""
        task = asyncio.ensure_future(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    # ------------------------------------------------------------------ workers
    def healthy(self) -> list[str]:
        return [url for url, up in self.upstreams.items() if up.healthy]

    def models(self) -> list[str]:
        names: dict[str, None] = {}
        for up in self.upstreams.values():
            if up.healthy:
                names.update(dict.fromkeys(up.models))
        return list(names)

    def check_model(self, model: str | None) -> None:
        if model is None:
            return
        for up in self.upstreams.values():  # the hot path: no list built per request
            if up.healthy and model in up.models:
                return
        known = self.models()
        # One model served: any name reaches it, as SGLang answers "default" or any name
        # when it serves one model (its own examples send "default"); with several models
        # the name picks one, so an unknown name is an error.
        strict = len(known) > 1 or self.config.strict_model_names
        if strict and known and model not in known:
            raise ApiError(
                404,
                f"model: unknown model {model!r}; available: {', '.join(known)}",
                code="model_not_found",
            )

    async def check_health(self) -> None:
        await self.health.check()

    def eject(self, worker: str, reason: str) -> None:
        self.health.eject(worker, reason)

    @property
    def max_request_cost(self) -> float:
        """Largest request cost seen (the ledger's)."""
        return self.accounting.max_request_cost

    def answer_failed(self, worker: str, reason: str, unreachable: bool) -> None:
        """Passive outlier detection (see ``HealthLoop.answer_failed``)."""
        self.health.answer_failed(worker, reason, unreachable)

    async def poll_evictions(self) -> None:
        await self.caches.poll()

    def bound_tree(self, worker: str) -> None:
        """Bound what the tree believes ``worker`` caches (see ``WorkerCaches``)."""
        self.caches.bound_tree(worker)

    async def _sample(self) -> None:
        """The periodic fairness sample, then a collection of the young generations.

        Why collect here (issue 18): the router's long-lived objects are created and
        freed at about the same rate (credit points, busy runs, latencies that live a
        window long), so the collector's allocation count barely moves, its young
        generations grow unexamined and a rare collection walks hundreds of thousands
        of them at once (40-60 ms for generation 1, 150-190 ms for a full one at 300
        requests a second with 10,000 clients; ``tests/perf/bench_gc.py``). Collected
        every sample, they hold the loop 0.3-5 ms. The per-client histories (the
        accounting's latencies and rates, the ledger's credit points and busy runs) are
        packed in bytearrays and a sample's backlogged names in a tuple, which the
        collector does not walk, so a full collection at 10,000 clients walks about two
        tracked objects a client and takes 4-8 ms (was 117-127 ms)."""
        more = self.accounting.sample(time.monotonic(), PRUNE_VISITS)
        while more:  # the history that left the window, dropped a slice per turn
            await asyncio.sleep(0)
            more = self.accounting.prune(PRUNE_VISITS)
        gc.collect(1)

    # ------------------------------------------------------------------ quanta
    def routed_extension(self, url: str) -> bool:
        """``url`` is a healthy worker with the fairserve extension."""
        return self.pushes.routed_extension(url)

    async def refresh_worker_quanta(self) -> None:
        """Read Q^u from workers with the extension whose value is not known yet."""
        await self.pushes.refresh_quanta()

    async def set_quanta(self, worker_quantum: float | None, quantum: float | None) -> list[str]:
        """Set Q^w (dispatcher) and/or Q^u (router queues and workers with the extension).

        Returns the workers that refused the forwarded Q^u (url: error)."""
        if worker_quantum is not None:
            self.settings.set_worker_quantum(worker_quantum)
        errors: list[str] = []
        if quantum is not None:
            self.settings.set_quantum(quantum)
            errors = await self.pushes.push_quantum(quantum)
        if worker_quantum is not None or quantum is not None:
            self._save()
        return errors

    # ------------------------------------------------------------------ weights
    async def set_weight(self, client: str, weight: float) -> dict[str, Any]:
        """Change ``client``'s weight everywhere the router applies it: the dispatcher's
        deficits, the router-side fair queues, the accounting (Jain's index and service
        rates are weight-normalised) and, pushed, the workers' own policies.

        Workers without a weights endpoint keep their weights; they are listed under
        ``workers`` as ``unsupported``."""
        previous = self.settings.set_weight(client, weight)
        queues = self.queues.count()
        self._save()
        return {
            "client": client,
            "weight": weight,
            "previous": previous,
            "router_queues": queues,
            "workers": await self.pushes.push_weight(client, weight),
        }
