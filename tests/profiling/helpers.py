"""Profiling test helpers: a simulated worker with a known profile, served in-process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

from fairserve.sim.profile import Profile, profile_from_toml
from fairserve.worker.config import WorkerConfig
from fairserve.worker.server import WorkerServer
from tests.fakes.profiles import synthetic_profile_toml

T = TypeVar("T")

SWEEP_SPEED = 50.0
"""Fast enough for a quick sweep in about a second; engine timing does not care."""
TIMEOUT_S = 45.0


def truth_profile(
    c_s: float = 0.02,
    a_s_per_token: float = 2e-5,
    b0_tokens: int = 128,
    attention_s_per_token: float = 1e-7,
    step_overhead_s: float = 0.0,
    max_batch_tokens: int = 2048,
    kv_capacity_tokens: int = 65536,
) -> Profile:
    """A profile with round numbers to recover (slow steps: client timing stays precise)."""
    text = synthetic_profile_toml(
        provenance="the truth a profiling test must recover",
        model="test-org/test-model",
        c_s=c_s,
        a_s_per_token=a_s_per_token,
        b0_tokens=b0_tokens,
        attention_s_per_token=attention_s_per_token,
        step_overhead_s=step_overhead_s,
        kv_capacity_tokens=kv_capacity_tokens,
        max_batch_tokens=max_batch_tokens,
    )
    return profile_from_toml(text, name="truth")


@asynccontextmanager
async def worker(profile: Profile, speed: float = SWEEP_SPEED) -> AsyncIterator[WorkerServer]:
    server = WorkerServer(WorkerConfig(profile=profile, speed=speed), "127.0.0.1", 0)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def run(coro: Awaitable[T], timeout_s: float = TIMEOUT_S) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout=timeout_s)

    return asyncio.run(bounded())
