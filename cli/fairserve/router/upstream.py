"""The workers behind the router: what is known about each, and keeping it current.

Each :class:`Upstream` is probed at start and every ``health_interval_s``: ``/health``
decides ejection and reinstatement; at (re)admission the router also reads
``/get_server_info`` (KV capacity), ``/v1/models`` (model names) and whether the worker
has the fairserve extension (``/fairserve/worker/state``: 200 yes, 404 no). Workers with
the extension report their prefix-cache evictions (``/fairserve/worker/evictions``, a
cursor the router follows); for the others the router bounds what its global tree believes
they cache by their KV capacity, evicting LRU (approximate, like sglang-router's tree).

A worker that restarted comes back with an empty cache, so on reinstatement everything
the tree recorded for it is forgotten.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import aiohttp

from fairserve.api import paths
from fairserve.api.auth import admin_headers
from fairserve.core.types import tokens_to_key
from fairserve.router.fairqueue import FairQueue
from fairserve.router.pool import Pool

log = logging.getLogger("fairserve.router")

EVICTION_PAGE = 1000


@dataclass(eq=False)
class Upstream:
    """One worker as the router sees it; ``url`` is its id in the dispatcher."""

    url: str
    healthy: bool = False
    probed: bool = False
    extension: bool | None = None
    max_total_tokens: int | None = None
    context_tokens: int | None = None
    """The model's context length (prompt + output) as the worker reports it."""
    capacity_tokens_per_s: float | None = None
    running_bound: int | None = None
    """Requests the worker runs at once (``max_running_requests``; None: not reported): the
    router sends it no more, besides clients below their share (``router.slots``)."""
    extension_url: str | None = None
    models: list[str] = field(default_factory=list)
    queue: FairQueue | None = None
    eviction_cursor: int = 0
    in_flight: int = 0
    ejections: int = 0
    reinstatements: int = 0
    consecutive_failures: int = 0
    """Failed health checks in a row."""
    failed_answers: int = 0
    """Proxied requests in a row that failed on this worker (5xx, invalid, reset, stalled):
    passive outlier detection ejects it at ``outlier_failures``."""
    outlier_ejections: int = 0
    """Ejections for failed answers since the last good one (each doubles the hold)."""
    hold_until_s: float = 0.0
    """A worker ejected for failed answers is not reinstated before this (monotonic)."""
    last_error: str | None = None
    pool: Pool | None = None
    """Keep-alive connections of the proxied requests (opened at the first one)."""
    heads: dict[str, bytes] = field(default_factory=dict)
    """Route → the constant start of its upstream request."""

    @property
    def extension_base(self) -> str:
        """Where ``/fairserve/worker/*`` lives: a side port (SGLang plugin) or the worker."""
        return self.extension_url or self.url

    @property
    def fairness(self) -> str:
        """Where fairness is enforced for this worker: ``inside`` or ``router``."""
        return "router" if self.queue is not None else "inside"


QueueFactory = Callable[[Upstream], FairQueue | None]
Hook = Callable[[Upstream], None]


class HealthProber:
    """Probes workers and applies ejection/reinstatement; owns no state of its own."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        timeout_s: float,
        on_up: Hook,
        on_down: Hook,
        admin_token: str | None = None,
    ) -> None:
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.on_up = on_up
        self.on_down = on_down
        self.admin_token = admin_token

    async def probe(self, up: Upstream) -> bool:
        """One health check; updates ``up`` and calls the hooks on a transition."""
        try:
            async with self.session.get(up.url + "/health", timeout=self.timeout) as resp:
                await resp.read()
                ok = resp.status == 200
                error = None if ok else f"/health answered {resp.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            ok, error = False, _describe(exc)
        if ok and not up.healthy and time.monotonic() < up.hold_until_s:
            return False  # ejected for failed answers: /health alone does not vouch for it
        if ok and not up.healthy:
            try:
                await self.discover(up)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                ok, error = False, f"discovery failed: {_describe(exc)}"
        up.probed = True
        if ok:
            up.consecutive_failures = 0
            if not up.healthy:
                self.mark_up(up)
        else:
            up.consecutive_failures += 1
            up.last_error = error
            if up.healthy:
                self.mark_down(up, error or "unhealthy")
        return ok

    def mark_up(self, up: Upstream) -> None:
        up.healthy = True
        up.last_error = None
        if up.ejections:
            up.reinstatements += 1
            log.warning("worker %s is back: reinstated", up.url)
        self.on_up(up)

    def mark_down(self, up: Upstream, reason: str) -> None:
        """Eject ``up`` (no new requests) until a health check succeeds again."""
        if not up.healthy:
            return
        up.healthy = False
        up.ejections += 1
        up.last_error = reason
        log.warning("worker %s ejected: %s", up.url, reason)
        self.on_down(up)

    async def discover(self, up: Upstream) -> None:
        """Capacity, models and the fairserve extension of a worker coming up."""
        info = await self._get_json(up, "/get_server_info")
        if isinstance(info, dict):
            tokens = info.get("max_total_num_tokens")
            if isinstance(tokens, int) and tokens > 0:
                up.max_total_tokens = tokens
            up.capacity_tokens_per_s = _capacity(info)
            running = info.get("max_running_requests")
            valid = isinstance(running, int) and not isinstance(running, bool) and running > 0
            up.running_bound = running if valid else None
        models = await self._get_json(up, "/v1/models")
        if isinstance(models, dict) and isinstance(models.get("data"), list):
            up.models = [str(m["id"]) for m in models["data"] if isinstance(m, dict) and "id" in m]
        up.context_tokens = context_length(info, models)
        state = await self._get_json(up, paths.WORKER_STATE, up.extension_base)
        up.extension = state is not None
        up.eviction_cursor = 0

    async def put_quantum(self, up: Upstream, quantum: float) -> str | None:
        """Forward Q^u to a worker with the extension; returns an error text or None."""
        headers = admin_headers(self.admin_token)
        try:
            async with self.session.put(
                up.extension_base + paths.WORKER_QUANTUM,
                json={"quantum": quantum},
                headers=headers,
                timeout=self.timeout,
            ) as resp:
                if resp.status == 200:
                    return None
                return f"{up.url}: {resp.status} {(await resp.text())[:200]}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return f"{up.url}: {_describe(exc)}"

    async def _get_json(self, up: Upstream, path: str, base: str | None = None) -> Any:
        """The JSON of a GET, or None when the worker does not serve ``path`` (404/405)."""
        url = (base or up.url) + path
        async with self.session.get(url, timeout=self.timeout) as resp:
            if resp.status in (404, 405):
                return None
            resp.raise_for_status()
            return await resp.json(content_type=None)


EvictionSink = Callable[[str, bytes], None]


async def poll_evictions(
    session: aiohttp.ClientSession,
    up: Upstream,
    sink: EvictionSink,
    timeout_s: float,
    admin_token: str | None = None,
) -> int:
    """Follow ``up``'s eviction feed from its cursor (with the admin token: the feed carries
    tenants' prompts, so a worker with a token shows it to the router only); returns the
    events applied.

    ``dropped`` (the router fell behind, or the worker restarted) means the router's view
    of this worker's cache is stale: forget it (``sink(url, b"")``)."""
    applied = 0
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    while True:
        query = f"since={up.eviction_cursor}&limit={EVICTION_PAGE}"
        url = f"{up.extension_base}{paths.WORKER_EVICTIONS}?{query}"
        async with session.get(url, timeout=timeout, headers=admin_headers(admin_token)) as resp:
            if resp.status == 404:
                up.extension = False
                return applied
            resp.raise_for_status()
            page = await resp.json(content_type=None)
        if page.get("dropped"):
            sink(up.url, b"")
        events = page.get("events") or []
        for event in events:
            sink(up.url, tokens_to_key(event.get("tokens") or []))
        applied += len(events)
        up.eviction_cursor = int(page.get("next", up.eviction_cursor))
        if len(events) < EVICTION_PAGE:
            return applied


async def every(interval_s: float, job: Callable[[], Awaitable[None]]) -> None:
    """Run ``job`` every ``interval_s`` until cancelled; a failing job is logged, not fatal."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await job()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background job failed")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, TimeoutError) or not text:
        return type(exc).__name__
    return text


def context_length(server_info: Any, models: Any) -> int | None:
    """The context length a worker reports: the smallest ``max_model_len`` of its
    ``/v1/models`` entries (SGLang and vLLM), else ``context_length`` in
    ``/get_server_info`` (SGLang's server arguments; null when not set); None if neither."""
    found: list[Any] = []
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        found = [m.get("max_model_len") for m in models["data"] if isinstance(m, dict)]
    if not any(_positive_int(v) for v in found) and isinstance(server_info, dict):
        found = [server_info.get("context_length")]
    lengths: list[int] = [v for v in found if _positive_int(v)]
    return min(lengths) if lengths else None


def _positive_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _capacity(server_info: dict[str, Any]) -> float | None:
    """Tokens/s from the fairserve section of ``/get_server_info`` (stock engines: unknown)."""
    section = server_info.get("fairserve")
    value = section.get("capacity_tokens_per_s") if isinstance(section, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None
