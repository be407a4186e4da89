"""Waiting for workers and routers to answer ``/health``, with bounded time.

A worker that exits while we wait is an error at once (its log says why, so the message
names it); one that stays silent until the deadline is *unavailable* (exit 3), like an
unreachable ``--worker-url``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from fairserve.api import paths
from fairserve.core.errors import FairserveError

POLL_S = 0.1


class WorkerUnreachable(ConnectionError):
    """A worker did not become healthy in time (a ConnectionError: exit code 3)."""


async def probe(session: aiohttp.ClientSession, url: str, timeout_s: float = 1.0) -> str | None:
    """None when ``url/health`` answers 200, else what went wrong (for messages)."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(url + paths.HEALTH, timeout=timeout) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return str(exc) or type(exc).__name__


async def wait_healthy(
    session: aiohttp.ClientSession,
    name: str,
    url: str,
    timeout_s: float,
    exited: Callable[[], int | None] = lambda: None,
    log_path: Path | None = None,
) -> None:
    """Poll until healthy; raise naming the worker (and its log) on exit or timeout."""
    deadline = time.monotonic() + timeout_s
    error: str | None = "not probed"
    label = name if name == url else f"{name} ({url})"
    while time.monotonic() < deadline:
        code = exited()
        if code is not None:
            raise FairserveError(
                f"{label} exited with status {code} before it was healthy; "
                f"its log: {log_path}{_tail(log_path)}"
            )
        error = await probe(session, url)
        if error is None:
            return
        await asyncio.sleep(POLL_S)
    where = f"; its log: {log_path}" if log_path else ""
    raise WorkerUnreachable(
        f"worker {label} did not answer /health within {timeout_s:g} s ({error}){where}"
    )


def _tail(path: Path | None, lines: int = 5) -> str:
    """The last lines of a log, indented, so the cause shows without opening the file."""
    if path is None:
        return ""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "".join(f"\n  | {line}" for line in text[-lines:])
