"""The router's fairness settings, pushed to the workers that enforce them themselves.

A worker with the fairserve extension runs its own in-engine policy, so each weight and
Q^u the router's :class:`~fairserve.router.settings.FairnessSettings` holds is forwarded to
it (``PUT /fairserve/worker/weights``, ``.../quantum``), again when it comes (back) up, and
what it reports is recorded in the settings (``worker_quanta``). This module owns those
exchanges; the router only asks for them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import aiohttp

from fairserve.api import paths
from fairserve.api.auth import admin_headers
from fairserve.router.settings import FairnessSettings
from fairserve.router.upstream import HealthProber, Upstream

log = logging.getLogger("fairserve.router")

Spawn = Callable[[Coroutine[Any, Any, Any]], None]


class WorkerPushes:
    """Forwards weights and Q^u to the workers with the extension, and reads theirs back.

    ``session`` and ``prober`` are the router's, read at each push (they exist from the
    router's start on); ``spawn`` runs a push in the background (a worker coming up)."""

    def __init__(
        self,
        settings: FairnessSettings,
        upstreams: Mapping[str, Upstream],
        timeout_s: float,
        admin_token: str | None,
        spawn: Spawn,
    ) -> None:
        self.settings = settings
        self.upstreams = upstreams
        self.timeout_s = timeout_s
        self.admin_token = admin_token
        self.spawn = spawn
        self.session: aiohttp.ClientSession | None = None
        self.prober: HealthProber | None = None

    def start(self, session: aiohttp.ClientSession, prober: HealthProber) -> None:
        self.session, self.prober = session, prober

    def stop(self) -> None:
        self.session = self.prober = None

    def targets(self) -> list[Upstream]:
        """The workers a change is pushed to now: healthy, with the extension."""
        return [up for up in self.upstreams.values() if up.healthy and up.extension]

    def routed_extension(self, url: str) -> bool:
        """``url`` is a healthy worker with the fairserve extension."""
        up = self.upstreams.get(url)
        return up is not None and up.healthy and bool(up.extension)

    # ------------------------------------------------------------------ a worker comes up
    def worker_up(self, up: Upstream) -> None:
        """A worker with the extension (re)joined: it runs its own default until told, so
        push Q^u (or read its own) and every weight changed live."""
        if not (up.extension and self.prober is not None):
            return
        self.settings.forget(up.url)  # a restarted worker runs its own default
        if self.settings.quantum is not None:
            self.spawn(self.push_quantum_to(up, self.settings.quantum))
        else:
            self.spawn(self.read_quantum(up))
        for client, weight in self.settings.live_weights.items():
            self.spawn(self.push_weight_to(up, client, weight))

    # ------------------------------------------------------------------ quanta
    async def refresh_quanta(self) -> None:
        """Read Q^u from healthy workers with the extension whose value is not known yet
        (a worker that came up a moment ago)."""
        missing = [
            up
            for url, up in self.upstreams.items()
            if self.routed_extension(url) and url not in self.settings.worker_quanta
        ]
        if missing and self.session is not None:
            await asyncio.gather(*(self.read_quantum(up) for up in missing))

    async def read_quantum(self, up: Upstream) -> None:
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
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

    async def push_quantum(self, quantum: float) -> list[str]:
        """Q^u to every target; returns the refusals (url: error)."""
        pushes = (self.push_quantum_to(up, quantum) for up in self.targets())
        results = await asyncio.gather(*pushes)
        return [error for error in results if error]

    async def push_quantum_to(self, up: Upstream, quantum: float) -> str | None:
        assert self.prober is not None
        error = await self.prober.put_quantum(up, quantum)
        if error:
            log.warning("could not set the quantum of worker %s", error)
            self.settings.forget(up.url)
        else:
            self.settings.reported(up.url, quantum)
        return error

    # ------------------------------------------------------------------ weights
    async def push_weight(self, client: str, weight: float) -> dict[str, str]:
        """``client``'s weight to every target: url -> ``ok`` | ``unsupported`` | error."""
        pushes = (self.push_weight_to(up, client, weight) for up in self.targets())
        return dict(await asyncio.gather(*pushes))

    async def push_weight_to(self, up: Upstream, client: str, weight: float) -> tuple[str, str]:
        """(url, ``ok`` | ``unsupported`` | the error): 404/405 mean a worker without the
        weights endpoint (a stock engine, an older fairserve worker)."""
        assert self.session is not None
        try:
            async with self.session.put(
                up.extension_base + paths.WORKER_WEIGHTS,
                json={"client": client, "weight": weight},
                headers=admin_headers(self.admin_token),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
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
