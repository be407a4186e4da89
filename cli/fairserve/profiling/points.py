"""Measuring one sweep point against a worker, with engine or client timing.

Engine timing brackets a point with snapshots of the worker's step counters and accepts the
difference only when it is exactly the steps the point should have caused (one step of ``L``
prefill tokens; ``k`` steps of ``N`` decodes with no prefill; ...): anything else (another
client's traffic, a retraction, a chunked prompt) is dropped, not fitted. Client timing has
no step boundaries to check, so it takes the least of several repetitions for prefill (noise
only ever adds time) and a long streamed window for decode.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from fairserve.profiling.client import EngineCounters, Generation, WorkerClient, WorkerError
from fairserve.profiling.observations import (
    Observation,
    decode_window,
    mixed_window,
    prefill,
)
from fairserve.profiling.plan import DecodePoint

POLL_S = 0.005
IDLE_POLL_S = 0.01
_TOKEN_LOW, _TOKEN_HIGH = 1000, 30000


@dataclass
class PointContext:
    """What every point measurement needs: the worker, prompts, clocks and limits."""

    client: WorkerClient
    rng: random.Random
    speed: float
    timeout_s: float

    def prompt(self, tokens: int) -> list[int]:
        """Fresh random token ids: no prefix of one prompt is cached from another."""
        return [self.rng.randrange(_TOKEN_LOW, _TOKEN_HIGH) for _ in range(tokens)]

    async def counters(self) -> EngineCounters:
        snapshot = await self.client.counters()
        if snapshot is None:
            raise WorkerError(f"{self.client.url}: the worker stopped reporting step counters")
        return snapshot

    async def until(self, check: Callable[[], Awaitable[bool]], what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not await check():
            if time.monotonic() > deadline:
                raise WorkerError(f"{self.client.url}: timed out after {self.timeout_s:g} s {what}")
            await asyncio.sleep(IDLE_POLL_S)

    async def wait_idle(self, engine: bool) -> EngineCounters | None:
        """Wait for no running or waiting request, then drop the prefix cache."""
        if engine:
            await self.until(self._idle, "waiting for the worker to go idle")
        await self.until(self._flushed, "waiting for /flush_cache to succeed")
        return await self.counters() if engine else None

    async def _idle(self) -> bool:
        return (await self.counters()).idle

    async def _flushed(self) -> bool:
        return await self.client.flush_cache()


# ---------------------------------------------------------------------- prefill
async def prefill_engine(ctx: PointContext, tokens: int) -> Observation | None:
    before = await ctx.wait_idle(engine=True)
    assert before is not None
    await ctx.client.generate(ctx.prompt(tokens), 1)
    after = await ctx.counters()
    steps = after.steps - before.steps
    fresh = after.prefill_tokens - before.prefill_tokens == tokens
    if steps != 1 or not fresh or after.cached_tokens != before.cached_tokens:
        return None
    return prefill(tokens, after.busy_s - before.busy_s, "engine", f"prefill {tokens}")


async def prefill_client(ctx: PointContext, tokens: int, repetitions: int) -> Observation:
    times = []
    for _ in range(repetitions):
        await ctx.wait_idle(engine=False)
        result = await ctx.client.generate(ctx.prompt(tokens), 1)
        times.append(_engine_seconds(result, ctx.speed))
    return prefill(tokens, min(times), "client", f"prefill {tokens}")


def _engine_seconds(result: Generation, speed: float) -> float:
    """The server's ``e2e_latency`` (engine seconds), else client wall time × speed."""
    return result.e2e_s if result.e2e_s is not None else result.wall_s * speed


# ---------------------------------------------------------------------- decode, engine timing
async def decode_engine(
    ctx: PointContext, point: DecodePoint, output_tokens: int, window_wall_s: float
) -> list[Observation]:
    """One decode run: a pure decode window, then one mixed window per planned prefill."""
    start = await ctx.wait_idle(engine=True)
    assert start is not None
    n, prompt = point.running, point.prompt_tokens
    tasks = [
        asyncio.create_task(ctx.client.generate(ctx.prompt(prompt), output_tokens))
        for _ in range(n)
    ]
    try:
        opened = await _steady(ctx, point, start, tasks)
        if opened is None:
            return []
        return await _windows(ctx, point, start, opened, window_wall_s, output_tokens)
    finally:
        for task in tasks:
            task.cancel()  # the worker aborts a request whose client went away
        await asyncio.gather(*tasks, return_exceptions=True)


async def _steady(
    ctx: PointContext,
    point: DecodePoint,
    start: EngineCounters,
    tasks: list[asyncio.Task[Generation]],
) -> EngineCounters | None:
    """The first snapshot where every request is prefilled and decoding, or None if one
    finished first (the run was too short to open a window)."""
    deadline = time.monotonic() + ctx.timeout_s
    want_prefill = point.running * point.prompt_tokens
    while time.monotonic() < deadline:
        snap = await ctx.counters()
        prefilled = snap.prefill_tokens - start.prefill_tokens >= want_prefill
        if prefilled and snap.running == point.running and snap.waiting == 0:
            return snap
        if any(task.done() for task in tasks):
            _raise_failed(tasks)
            return None
        await asyncio.sleep(POLL_S)
    raise WorkerError(f"{ctx.client.url}: decode point never reached {point.running} running")


def _raise_failed(tasks: list[asyncio.Task[Generation]]) -> None:
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise WorkerError(f"decode request failed: {task.exception()}")


async def _windows(
    ctx: PointContext,
    point: DecodePoint,
    start: EngineCounters,
    opened: EngineCounters,
    window_wall_s: float,
    output_tokens: int,
) -> list[Observation]:
    n, prompt = point.running, point.prompt_tokens
    snaps = [opened]
    stop_at = time.monotonic() + window_wall_s
    # On a small KV pool the requests may have fewer tokens left than the window would
    # take: close it with half of them left, so the mixed windows still find every
    # request running.
    left = output_tokens - (opened.decode_tokens - start.decode_tokens) // n
    max_steps = max(2, left // 2) if point.mixed_prefill_tokens else max(2, left - 2)
    while time.monotonic() < stop_at and snaps[-1].steps - opened.steps < max_steps:
        await asyncio.sleep(POLL_S)
        snaps.append(await ctx.counters())
    last = max((s for s in snaps if _pure_decode(opened, s, n)), key=lambda s: s.steps)
    observations = []
    if last.steps - opened.steps >= 2:
        outputs = opened.decode_tokens - start.decode_tokens
        observations.append(_decode_obs(point, outputs, opened, last))
    for injected, tokens in enumerate(point.mixed_prefill_tokens):
        before = await ctx.counters()
        await ctx.client.generate(ctx.prompt(tokens), 1)
        after = await ctx.counters()
        # Each earlier injected prompt added its one output token to the counter.
        outputs = before.decode_tokens - start.decode_tokens - injected
        if _one_mixed_step(before, after, n, tokens):
            window = decode_window(n, prompt, outputs, after.steps - before.steps, 0.0, "engine")
            mixed = mixed_window(window, tokens, after.busy_s - before.busy_s)
            observations.append(replace(mixed, label=f"mixed N={n} + prefill {tokens}"))
    return observations


def _decode_obs(
    point: DecodePoint, outputs: int, a: EngineCounters, b: EngineCounters
) -> Observation:
    return decode_window(
        point.running,
        point.prompt_tokens,
        outputs,
        b.steps - a.steps,
        b.busy_s - a.busy_s,
        "engine",
        point.label,
    )


def _pure_decode(a: EngineCounters, b: EngineCounters, running: int) -> bool:
    """Every step between the snapshots decoded all ``running`` requests and nothing else."""
    steps = b.steps - a.steps
    return (
        b.running == running
        and b.waiting == 0
        and b.prefill_tokens == a.prefill_tokens
        and b.decode_tokens - a.decode_tokens == running * steps
    )


def _one_mixed_step(a: EngineCounters, b: EngineCounters, running: int, tokens: int) -> bool:
    """Between the snapshots: decode steps of ``running``, one of them with one prompt of
    ``tokens`` prefilled whole (which then finished with its single token)."""
    steps = b.steps - a.steps
    return (
        steps >= 1
        and b.running == running
        and b.waiting == 0
        and b.prefill_tokens - a.prefill_tokens == tokens
        and b.cached_tokens == a.cached_tokens
        and b.decode_tokens - a.decode_tokens == running * steps + 1
    )


# ---------------------------------------------------------------------- decode, client timing
async def decode_client(
    ctx: PointContext, point: DecodePoint, output_tokens: int
) -> list[Observation]:
    """``N − 1`` plain requests then one streamed probe; the window runs from the probe's
    first token (everyone admitted) to just before the first other request completes."""
    await ctx.wait_idle(engine=False)
    n, prompt = point.running, point.prompt_tokens
    ends: list[float] = []

    async def plain() -> Generation:
        result = await ctx.client.generate(ctx.prompt(prompt), output_tokens)
        ends.append(time.monotonic())
        return result

    others = [asyncio.create_task(plain()) for _ in range(n - 1)]
    await asyncio.sleep(0)
    try:
        probe = await ctx.client.generate(ctx.prompt(prompt), output_tokens, stream=True)
        await asyncio.gather(*others)
    finally:
        for task in others:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*others, return_exceptions=True)
    end_s = min(ends) if ends else probe.token_times_s[-1][0] + 1.0
    window = [(t, k) for t, k in probe.token_times_s if k >= 1 and t < end_s]
    if len(window) < 2 or window[-1][1] - window[0][1] < 2:
        return []
    (t0, k0), (t1, k1) = window[0], window[-1]
    return [decode_window(n, prompt, n * k0, k1 - k0, (t1 - t0) * ctx.speed, "client", point.label)]
