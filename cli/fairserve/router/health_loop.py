"""Which workers are in rotation: health checks, ejection, reinstatement, passive outlier
detection, and what follows a worker coming up or going down.

The router starts and stops this loop; the loop owns the prober and the verdicts. A worker
that comes (back) up is told to the ``on_up`` hooks in order (its cache is forgotten, it
gets its fair queue, the fairness settings are pushed to it); one that goes down fails the
requests still waiting for its first answer byte (their handlers retry them elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import aiohttp

from fairserve.router.config import RouterConfig
from fairserve.router.upstream import HealthProber, Upstream, every

log = logging.getLogger("fairserve.router")

Hook = Callable[[Upstream], None]


class HealthLoop:
    """Probes every worker at start and every ``health_interval_s``."""

    def __init__(
        self, config: RouterConfig, upstreams: Mapping[str, Upstream], on_up: Sequence[Hook]
    ) -> None:
        self.config = config
        self.upstreams = upstreams
        self.on_up = on_up
        self.prober: HealthProber | None = None

    def start(self, session: aiohttp.ClientSession) -> HealthProber:
        cfg = self.config
        self.prober = HealthProber(
            session, cfg.health_timeout_s, self._worker_up, self._worker_down, cfg.admin_token
        )
        return self.prober

    def task(self) -> asyncio.Task[None]:
        """The periodic checks (the router cancels the task when it closes)."""
        return asyncio.create_task(every(self.config.health_interval_s, self.check))

    async def check(self) -> None:
        assert self.prober is not None
        await asyncio.gather(*(self.prober.probe(up) for up in self.upstreams.values()))

    def eject(self, worker: str, reason: str) -> None:
        if self.prober is not None:
            self.prober.mark_down(self.upstreams[worker], reason)

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
        for hook in self.on_up:
            hook(up)

    def _worker_down(self, up: Upstream) -> None:
        """Requests still waiting for the worker's first answer byte fail now (their
        handlers retry them elsewhere) instead of waiting for a worker judged gone;
        answers already under way go on."""
        if up.pool is not None:
            up.pool.fail_unanswered(f"the worker was ejected: {up.last_error}")
