"""The router's long-lived state: dispatcher, workers, accounting, background jobs, quanta.

One :class:`Router` per server. HTTP handlers (``handlers``) and the proxy (``proxy``) call
into it; it never touches aiohttp's server side, so it is the part ``launch`` and tests can
drive directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import IO, Any

import aiohttp

from fairserve.api import paths
from fairserve.api.auth import admin_headers
from fairserve.core.errors import ConfigError
from fairserve.core.openai_api import ApiError
from fairserve.router import persist
from fairserve.router.accounting import Accounting
from fairserve.router.config import RouterConfig
from fairserve.router.fairqueue import DEFAULT_CACHE_TOKENS, FairQueue
from fairserve.router.feeds import LedgerFeed, MetricsFeed, TraceFeed, WorkerFeed
from fairserve.router.lifecycle import Lifecycle
from fairserve.router.metrics import RouterMetrics
from fairserve.router.settings import FairnessSettings, default_quantum
from fairserve.router.upstream import HealthProber, Upstream, every, poll_evictions
from fairserve.sched.dispatch.base import Dispatcher
from fairserve.sched.dispatch.cache_aware import LRU_LOW_WATERMARK
from fairserve.sched.local.base import local_policy_class
from fairserve.sched.registry import load_all, make_dispatcher, make_local_policy
from fairserve.workloads.trace import TraceWriter

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


FED_TREE_SLACK = 2
"""A worker with an eviction feed may hold at most this many times its KV capacity in the
router's tree (see ``Router.bound_tree``)."""
ROUTER_JUSTITIA_STEPS_PER_S = 30.0
"""Decode iterations per second the router assumes for Justitia's clock when none is given
(a 7-8B model's decode step on one GPU is some 20-40 ms)."""


def build_queue_policy(config: RouterConfig, weights: Mapping[str, float] | None = None) -> Any:
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


class Router:
    """Dispatcher, upstream pool, accounting and metrics of one router."""

    def __init__(self, config: RouterConfig) -> None:
        check_policy(config)
        self.config = config
        self.dispatcher = build_dispatcher(config, config.worker_urls)
        self.accounting = Accounting(config.weights, config.w_e, config.w_q)
        self.metrics = RouterMetrics(config.metrics_max_clients, config.weights)
        self.lifecycle = Lifecycle(
            [
                LedgerFeed(self.accounting),
                WorkerFeed(self),
                MetricsFeed(self.metrics, self.accounting),
            ]
        )
        """Every request's events reach the ledger, workers and metrics through here."""
        self.upstreams = {
            url: Upstream(url, extension_url=config.extension_urls.get(url))
            for url in config.worker_urls
        }
        self.settings = self._settings()
        """The one owner of weights and quanta (see ``router.settings``)."""
        self.settings_path = Path(config.settings_path) if config.settings_path else None
        self.restored_at_start = False
        """Settings were read back from ``settings_path`` at start."""
        self.saved_at: float | None = None
        """Unix time the live settings were last saved (or restored from)."""
        self._restore()
        self.session: aiohttp.ClientSession | None = None
        self.prober: HealthProber | None = None
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
    def _settings(self) -> FairnessSettings:
        """The settings and who applies them: the dispatcher (read at each change: a test
        may wrap it), the accounting and the router-side queues."""
        config = self.config
        settings = FairnessSettings(
            config.weights,
            config.quantum,
            self.dispatcher.quantum,
            getattr(build_queue_policy(config), "quantum", None),
            default_quantum(config.policy),
        )
        settings.on_weight(lambda client, weight: self.dispatcher.set_weight(client, weight))
        settings.on_weight(self._queues_weight)
        settings.on_weight(self.accounting.set_weight)  # never creates a client
        settings.on_quantum(self._queues_quantum)
        settings.on_worker_quantum(lambda quantum: self.dispatcher.set_quantum(quantum))
        return settings

    def _queues_weight(self, client: str, weight: float) -> None:
        for up in self.upstreams.values():
            if up.queue is not None:
                up.queue.policy.set_weight(client, weight)

    def _queues_quantum(self, quantum: float) -> None:
        build_queue_policy(self.config).set_quantum(quantum)  # refuses bad values first
        for up in self.upstreams.values():
            if up.queue is not None:
                up.queue.policy.set_quantum(quantum)

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

    def _restore(self) -> None:
        """Apply what the admin API changed before a restart (see ``router.persist``):
        saved weights over the clients file's; saved quanta where the command line set none."""
        if self.settings_path is None:
            return
        saved = persist.load(self.settings_path)
        if saved is None:
            return
        self.restored_at_start, self.saved_at = True, saved.saved_at
        for client, weight in saved.weights.items():
            self.settings.set_weight(client, weight)
        try:
            if self.config.quantum is None and saved.quantum is not None:
                self.settings.set_quantum(saved.quantum)
            if self.config.worker_quantum is None and saved.worker_quantum is not None:
                self.settings.set_worker_quantum(saved.worker_quantum)
        except ConfigError as exc:
            log.warning("saved quanta in %s do not apply: %s", self.settings_path, exc)
        log.info("restored live settings from %s", self.settings_path)

    def _save(self) -> None:
        """Write the live settings (atomically); a failure is logged, never fatal."""
        if self.settings_path is None:
            return
        settings = self.settings.live()
        try:
            persist.save(self.settings_path, settings)
        except OSError as exc:
            log.warning("could not save the live settings to %s: %s", self.settings_path, exc)
            return
        self.saved_at = settings.saved_at

    def settings_view(self) -> dict[str, Any]:
        """Where the fairness settings came from, for the state and ``status``."""
        return {
            "file": None if self.settings_path is None else str(self.settings_path),
            "restored_at_start": self.restored_at_start,
            "saved_at": self.saved_at,
            **self.settings.view(),
        }

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
        self.prober = HealthProber(
            self.session, cfg.health_timeout_s, self._worker_up, self._worker_down, cfg.admin_token
        )
        if cfg.trace_path is not None:
            self._trace_file = Path(cfg.trace_path).open("w", encoding="utf-8")  # noqa: SIM115
            self.trace = TraceWriter(self._trace_file)
            self._trace_feed = TraceFeed(self.trace, self.started_s)
            self.lifecycle.subscribe(self._trace_feed)
        await self.check_health()
        self.accounting.sample(time.monotonic())
        self._tasks = [
            asyncio.create_task(every(cfg.health_interval_s, self.check_health)),
            asyncio.create_task(every(cfg.eviction_interval_s, self.poll_evictions)),
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
        assert self.prober is not None
        await asyncio.gather(*(self.prober.probe(up) for up in self.upstreams.values()))

    def eject(self, worker: str, reason: str) -> None:
        if self.prober is not None:
            self.prober.mark_down(self.upstreams[worker], reason)

    @property
    def max_request_cost(self) -> float:
        """Largest request cost seen (the ledger's)."""
        return self.accounting.max_request_cost

    def answer_failed(self, worker: str, reason: str, unreachable: bool) -> None:
        """Passive outlier detection (a proper answer resets the counts: ``WorkerFeed``): a
        worker that could not be reached is ejected at once;
        one that answers badly (5xx, invalid answers, broken or stalled streams) after
        ``outlier_failures`` in a row, and is then held out for ``outlier_cooldown_s``,
        doubled per repeat (max 5 min), even if its ``/health`` says ok."""
        up = self.upstreams[worker]
        up.failed_answers += 1
        if unreachable:
            self.eject(worker, reason)
        elif up.failed_answers >= self.config.outlier_failures and up.healthy:
            hold_s = min(300.0, self.config.outlier_cooldown_s * 2**up.outlier_ejections)
            up.outlier_ejections += 1
            up.hold_until_s = time.monotonic() + hold_s
            self.eject(
                worker,
                f"{up.failed_answers} failed answers in a row (held out {hold_s:g}s); "
                f"last: {reason}",
            )

    def _worker_up(self, up: Upstream) -> None:
        # A worker that comes (back) up has an empty cache as far as we can know.
        self.dispatcher.on_evict(up.url, b"")
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
        if up.extension and self.prober is not None:
            self.settings.forget(up.url)  # a restarted worker runs its own default
            if self.settings.quantum is not None:
                self.spawn(self._forward_quantum(up, self.settings.quantum))
            else:
                self.spawn(self._read_worker_quantum(up))
            for client, weight in self.settings.live_weights.items():
                self.spawn(self._forward_weight(up, client, weight))

    def _worker_down(self, up: Upstream) -> None:
        """Requests still waiting for the worker's first answer byte fail now (their
        handlers retry them elsewhere) instead of waiting for a worker judged gone;
        answers already under way go on."""
        if up.pool is not None:
            up.pool.fail_unanswered(f"the worker was ejected: {up.last_error}")

    async def poll_evictions(self) -> None:
        assert self.session is not None
        for up in list(self.upstreams.values()):
            if up.healthy and up.extension:
                try:
                    await poll_evictions(
                        self.session,
                        up,
                        self.dispatcher.on_evict,
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
        prefixes = getattr(self.dispatcher, "prefixes", None)
        if prefixes is None:
            return
        capacity = up.max_total_tokens or DEFAULT_CACHE_TOKENS
        limit = capacity * (FED_TREE_SLACK if up.extension else 1)
        tree = prefixes.tree
        if tree.owner_tokens(worker) > limit:
            tree.evict_owner_lru(worker, int(limit * LRU_LOW_WATERMARK))

    async def _sample(self) -> None:
        self.accounting.sample(time.monotonic())

    # ------------------------------------------------------------------ quanta
    def routed_extension(self, url: str) -> bool:
        """``url`` is a healthy worker with the fairserve extension."""
        up = self.upstreams.get(url)
        return up is not None and up.healthy and bool(up.extension)

    async def refresh_worker_quanta(self) -> None:
        """Read Q^u from healthy workers with the extension whose value is not known yet
        (a worker that came up a moment ago)."""
        missing = [
            up
            for url, up in self.upstreams.items()
            if self.routed_extension(url) and url not in self.settings.worker_quanta
        ]
        if missing and self.session is not None:
            await asyncio.gather(*(self._read_worker_quantum(up) for up in missing))

    async def _read_worker_quantum(self, up: Upstream) -> None:
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=self.config.health_timeout_s)
        try:
            async with self.session.get(
                up.extension_base + paths.WORKER_QUANTUM, timeout=timeout
            ) as resp:
                body = await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            log.debug("could not read the quantum of worker %s: %s", up.url, exc)
            return
        if not isinstance(body, dict):
            return
        value = body.get("quantum")  # null: the worker's policy has no quantum
        if isinstance(value, bool) or not isinstance(value, int | float):
            value = None
        self.settings.reported(up.url, None if value is None else float(value))

    async def set_quanta(self, worker_quantum: float | None, quantum: float | None) -> list[str]:
        """Set Q^w (dispatcher) and/or Q^u (router queues and workers with the extension).

        Returns the workers that refused the forwarded Q^u (url: error)."""
        if worker_quantum is not None:
            self.settings.set_worker_quantum(worker_quantum)
        errors: list[str] = []
        if quantum is not None:
            self.settings.set_quantum(quantum)
            targets = [up for up in self.upstreams.values() if up.healthy and up.extension]
            results = await asyncio.gather(*(self._forward_quantum(up, quantum) for up in targets))
            errors = [e for e in results if e]
        if worker_quantum is not None or quantum is not None:
            self._save()
        return errors

    async def _forward_quantum(self, up: Upstream, quantum: float) -> str | None:
        assert self.prober is not None
        error = await self.prober.put_quantum(up, quantum)
        if error:
            log.warning("could not set the quantum of worker %s", error)
            self.settings.forget(up.url)
        else:
            self.settings.reported(up.url, quantum)
        return error

    # ------------------------------------------------------------------ weights
    async def set_weight(self, client: str, weight: float) -> dict[str, Any]:
        """Change ``client``'s weight everywhere the router applies it: the dispatcher's
        deficits, the router-side fair queues, the accounting (Jain's index and service
        rates are weight-normalised) and, pushed, the workers' own policies.

        Workers without a weights endpoint keep their weights; they are listed under
        ``workers`` as ``unsupported``."""
        previous = self.settings.set_weight(client, weight)
        queues = sum(1 for up in self.upstreams.values() if up.queue is not None)
        self._save()
        targets = [up for up in self.upstreams.values() if up.healthy and up.extension]
        pushes = await asyncio.gather(*(self._forward_weight(up, client, weight) for up in targets))
        return {
            "client": client,
            "weight": weight,
            "previous": previous,
            "router_queues": queues,
            "workers": dict(pushes),
        }

    async def _forward_weight(self, up: Upstream, client: str, weight: float) -> tuple[str, str]:
        """(url, ``ok`` | ``unsupported`` | the error): 404/405 mean a worker without the
        weights endpoint (a stock engine, an older fairserve worker)."""
        assert self.session is not None
        token = self.config.admin_token
        headers = admin_headers(token)
        try:
            async with self.session.put(
                up.extension_base + paths.WORKER_WEIGHTS,
                json={"client": client, "weight": weight},
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.config.health_timeout_s),
            ) as resp:
                text = await resp.text()
                status = resp.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            text, status = str(exc) or type(exc).__name__, 0
        if status == 200:
            return up.url, "ok"
        if status in (404, 405):
            return up.url, "unsupported"
        log.warning("could not set the weight of %r on worker %s: %s", client, up.url, text)
        return up.url, f"{status or 'unreachable'}: {text[:200]}"
