"""Where the dashboard's data comes from: a protocol, and the HTTP source for a live router.

One :meth:`StateSource.fetch` is one poll: the router's state, then (bounded in number and
time) each healthy worker's own view, then the local GPUs. The app never starts a poll
before the previous one ended; inside a poll, NVML is read in a thread and a read that
hangs is not started again until it returns (its last result stands meanwhile). Tests pass
their own source (fixed snapshots) through the same protocol.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any, Protocol

import aiohttp

from fairserve.api import paths
from fairserve.api.admin_client import NOT_A_ROUTER, quantum_body, state_query, status_text
from fairserve.api.auth import admin_headers
from fairserve.tui.model import GpuReadingLike, GpuView, Quanta, Snapshot, WorkerProbe, WorkerView
from fairserve.tui.parse import (
    parse_quanta,
    parse_sglang_metrics,
    parse_state,
    parse_worker_state,
)

PARALLEL_PROBES = 8
PROBE_BACKOFF_POLLS = 10
"""A worker that did not answer is skipped for this many polls (it may be remote and
unreachable from here; the router's view of it still shows)."""

GpuReader = Callable[[], Sequence[GpuReadingLike]]


class SourceError(Exception):
    """The router could not be read (unreachable, an error status, not JSON)."""


class QuantumRefused(SourceError):
    """The router refused a quantum change (no or wrong admin token, a policy without one)."""


class StateSource(Protocol):
    """What the dashboard polls and writes to."""

    @property
    def url(self) -> str: ...

    async def fetch(self) -> Snapshot:
        """One poll; raises :class:`SourceError` when the router cannot be read."""
        ...

    async def set_quanta(
        self, quantum: float | None = None, worker_quantum: float | None = None
    ) -> Quanta:
        """Set Q^u and/or Q^w; returns the router's new view (raises :class:`SourceError`)."""
        ...

    async def close(self) -> None: ...


def _describe(exc: BaseException, timeout_s: float) -> str:
    """A short reason for the banner (aiohttp's own messages run to a terminal line)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        error = exc.os_error
        reason = os.strerror(error.errno) if error.errno else str(error)
        return f"cannot connect ({reason.lower()})"
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g}s"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the router closed the connection"
    if isinstance(exc, ValueError):
        return f"not JSON ({exc})"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class HttpStateSource:
    """A live router over HTTP (aiohttp), plus its workers and the local GPUs."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 2.0,
        gpu_reader: GpuReader | None = None,
        probe_workers: bool = True,
        window_s: float = 60.0,
    ) -> None:
        self._url = url.rstrip("/")
        self.window_s = window_s
        self.token = token
        self.timeout_s = timeout_s
        self.gpu_reader = gpu_reader
        self.probe_workers = probe_workers
        self._session: aiohttp.ClientSession | None = None
        self._polls = 0
        self._skip_until: dict[str, int] = {}
        self._gpu_task: asyncio.Future[tuple[GpuView, ...]] | None = None
        self._gpus: tuple[GpuView, ...] = ()

    @property
    def url(self) -> str:
        return self._url

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def close(self) -> None:
        if self._gpu_task is not None:
            self._gpu_task.cancel()
            self._gpu_task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------ polling
    async def fetch(self) -> Snapshot:
        self._polls += 1
        try:
            query = state_query(self.window_s)
            async with self._client().get(self._url + paths.ROUTER_STATE, params=query) as resp:
                text = await resp.text()
                if resp.status != 200:
                    hint = f" ({NOT_A_ROUTER})" if resp.status == 404 else ""
                    where = self._url + paths.ROUTER_STATE
                    raise SourceError(f"{where}: HTTP {resp.status}{hint}")
            snapshot = parse_state(json.loads(text), self._url)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise SourceError(f"{self._url}: {_describe(exc, self.timeout_s)}") from exc
        probes = await self._probes(snapshot.workers) if self.probe_workers else {}
        return snapshot.with_probes(probes).with_gpus(await self._read_gpus())

    async def _probes(self, workers: Sequence[WorkerView]) -> dict[str, WorkerProbe]:
        due = [w for w in workers if w.healthy and self._skip_until.get(w.url, 0) <= self._polls]
        limit = asyncio.Semaphore(PARALLEL_PROBES)

        async def probe(worker: WorkerView) -> tuple[str, WorkerProbe | None]:
            async with limit:
                return worker.url, await self._probe(worker)

        results = await asyncio.gather(*(probe(w) for w in due))
        return {url: p for url, p in results if p is not None}

    async def _probe(self, worker: WorkerView) -> WorkerProbe | None:
        path = paths.WORKER_STATE if worker.extension else paths.METRICS
        base = (worker.extension_url if worker.extension else "") or worker.url
        try:
            async with self._client().get(base.rstrip("/") + path) as resp:
                if resp.status != 200:
                    raise SourceError(f"HTTP {resp.status}")
                text = await resp.text()
            if worker.extension:
                return parse_worker_state(json.loads(text))
            return parse_sglang_metrics(text)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, SourceError):
            self._skip_until[worker.url] = self._polls + PROBE_BACKOFF_POLLS
            return None

    async def _read_gpus(self) -> tuple[GpuView, ...]:
        reader = self.gpu_reader
        if reader is None:
            return ()
        if self._gpu_task is None:
            self._gpu_task = _read_in_thread(reader)
        done, _ = await asyncio.wait({self._gpu_task}, timeout=self.timeout_s)
        if self._gpu_task in done:
            task, self._gpu_task = self._gpu_task, None
            self._gpus = task.result()
        return self._gpus

    # ------------------------------------------------------------ writing
    async def set_quanta(
        self, quantum: float | None = None, worker_quantum: float | None = None
    ) -> Quanta:
        body = quantum_body(quantum, worker_quantum)
        headers = admin_headers(self.token)
        try:
            async with self._client().put(
                self._url + paths.ROUTER_QUANTUM, json=body, headers=headers
            ) as resp:
                raw = await resp.read()
                status = resp.status
            payload: Any = json.loads(raw) if raw and status == 200 else {}
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise SourceError(f"{self._url}: {_describe(exc, self.timeout_s)}") from exc
        if status != 200:
            raise QuantumRefused(status_text(status, raw))
        return parse_quanta(payload)


def _read_in_thread(reader: GpuReader) -> asyncio.Future[tuple[GpuView, ...]]:
    """Read the GPUs in a daemon thread: a driver call that never returns must neither
    block the event loop nor keep the process from exiting (the default executor's threads
    are joined at exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[tuple[GpuView, ...]] = loop.create_future()

    def deliver(views: tuple[GpuView, ...]) -> None:
        if not future.done():
            future.set_result(views)

    def read() -> None:
        views = _gpu_views(reader)
        with suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(deliver, views)

    threading.Thread(target=read, name="fairserve-top-nvml", daemon=True).start()
    return future


def _gpu_views(reader: GpuReader) -> tuple[GpuView, ...]:
    """Runs in a thread; NVML failing in any way means "no GPU readings", never a crash."""
    try:
        return tuple(GpuView.of(r) for r in reader())
    except Exception:  # a broken driver must not take the dashboard down
        return ()


def nvml_reader() -> GpuReader:
    """The local GPUs through the profiling package (the only place that talks to NVML)."""
    from fairserve.profiling.nvml import read_gpus

    return read_gpus
