"""Test helpers: a tiny profile, worker configs, a worker served on an ephemeral port.

Every test runs a real :class:`~fairserve.worker.server.WorkerServer` on 127.0.0.1 and talks
to it with a real aiohttp client. Simulated steps are short and ``speed`` is high, so a
request of a few tokens takes milliseconds of wall time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from fairserve.sim.profile import Profile, profile_from_toml
from fairserve.worker.config import WorkerConfig
from fairserve.worker.runtime import WorkerRuntime
from fairserve.worker.server import WorkerServer
from tests.fakes.profiles import synthetic_profile_toml

T = TypeVar("T")

FAST_SPEED = 50.0
STEP_S = 0.02
"""Simulated seconds of one small step with the tiny profile (``c_s``)."""


def profile_toml(kv_capacity_tokens: int = 4096, max_batch_tokens: int = 512) -> str:
    return synthetic_profile_toml(
        provenance="tiny profile for the worker tests",
        c_s=STEP_S,
        a_s_per_token=1e-05,
        b0_tokens=64,
        kv_capacity_tokens=kv_capacity_tokens,
        max_batch_tokens=max_batch_tokens,
    )


def tiny_profile(kv_capacity_tokens: int = 4096) -> Profile:
    return profile_from_toml(profile_toml(kv_capacity_tokens), name="tiny")


def write_profile(directory: Path, kv_capacity_tokens: int = 4096) -> Path:
    path = directory / "tiny.toml"
    path.write_text(profile_toml(kv_capacity_tokens), encoding="utf-8")
    return path


def make_config(**overrides: Any) -> WorkerConfig:
    values: dict[str, Any] = {"profile": tiny_profile(), "speed": FAST_SPEED}
    values.update(overrides)
    return WorkerConfig(**values)


@asynccontextmanager
async def serving(
    config: WorkerConfig | None = None, **server_kw: Any
) -> AsyncIterator[tuple[WorkerServer, aiohttp.ClientSession]]:
    """A worker on an ephemeral port and a client session whose base URL is the worker."""
    server = WorkerServer(config or make_config(), "127.0.0.1", 0, **server_kw)
    url = await server.start()
    try:
        async with aiohttp.ClientSession(
            base_url=url, timeout=aiohttp.ClientTimeout(total=10)
        ) as session:
            yield server, session
    finally:
        await server.stop()


def runtime_of(server: WorkerServer) -> WorkerRuntime:
    assert server.runtime is not None, "server not started"
    return server.runtime


def run(coro: Awaitable[T]) -> T:
    """Run one test body in a fresh event loop (no pytest-asyncio needed)."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout=20)

    return asyncio.run(bounded())


async def post_json(
    session: aiohttp.ClientSession, path: str, body: Any, **kw: Any
) -> tuple[int, Any]:
    async with session.post(path, json=body, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


async def generate(
    session: aiohttp.ClientSession, max_new_tokens: int, **fields: Any
) -> tuple[int, Any]:
    """``POST /generate`` of a prompt (``input_ids=`` or ``text=``, and any other field of
    the body) for ``max_new_tokens``: the status and the JSON answer."""
    sampling = {"sampling_params": {"max_new_tokens": max_new_tokens}}
    return await post_json(session, "/generate", {**fields, **sampling})


async def get_json(session: aiohttp.ClientSession, path: str) -> tuple[int, Any]:
    async with session.get(path) as resp:
        return resp.status, await resp.json(content_type=None)


async def sse_events(resp: aiohttp.ClientResponse) -> list[Any]:
    """Every ``data:`` payload of an SSE response, ``[DONE]`` kept as the string."""
    events: list[Any] = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def wait_until(
    condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
