"""The sweep driver: warm-up, prefill points, decode and mixed points, GPU sampling.

``run_sweep(url, SweepOptions(quick=True))`` measures one worker and returns every accepted
:class:`~fairserve.profiling.observations.Observation` with what is known about the worker
and its GPU; :mod:`fairserve.profiling.fit` turns them into coefficients. Points run in a
seeded random order so that a slow drift (a GPU warming up, clocks settling) spreads over
the load range instead of tilting the fitted slope; the prefix cache is flushed before every
point so no prompt is served from cache.

Decode runs are sized in *steps*: a window should last ``window_wall_s`` of wall time, which
at ``--speed K`` is ``K·window_wall_s / step_s`` steps, capped by the KV pool. Engine-timed
runs are cut (aborted) once their windows are measured, so a long generation never costs
more wall time than its window.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import random
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp

from fairserve.core.errors import ConfigError
from fairserve.profiling.client import (
    EngineCounters,
    WorkerClient,
    WorkerError,
    WorkerUnreachable,
)
from fairserve.profiling.observations import Observation, Timing
from fairserve.profiling.plan import DecodePoint, SweepPlan, WorkerLimits, make_plan
from fairserve.profiling.points import (
    PointContext,
    decode_client,
    decode_engine,
    prefill_client,
    prefill_engine,
)
from fairserve.profiling.sampler import GpuIdentity, NvmlSampler

TimingChoice = Literal["auto", "engine", "client"]
ProgressFn = Callable[[int, int, str], None]
_KV_SHARE = 0.45
_MIN_DECODE_STEPS = 24


@dataclass(frozen=True)
class SweepOptions:
    quick: bool = False
    timing: TimingChoice = "auto"
    seed: int = 0
    request_timeout_s: float = 120.0
    nvml: Any | None = None
    """An object with pynvml's API (tests pass a fake); None: import pynvml if present."""
    sample_gpu: bool | None = None
    """Sample NVML; None: when the worker runs on this host and is not simulated."""
    gpu_index: int = 0
    sample_interval_s: float = 0.1


@dataclass(frozen=True)
class PointEnergy:
    """Energy NVML measured over one point and the tokens the worker processed in it."""

    label: str
    energy_j: float
    tokens: int


@dataclass
class SweepResult:
    url: str
    server_info: dict[str, Any]
    limits: WorkerLimits
    timing: Timing
    plan: SweepPlan
    observations: list[Observation]
    wall_s: float = 0.0
    dropped: int = 0
    """Points whose counters showed other steps than planned (other traffic, retraction)."""
    gpu: GpuIdentity | None = None
    slowdowns: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)
    energy: list[PointEnergy] = field(default_factory=list)

    @property
    def joules_per_token(self) -> float | None:
        """Energy over all points per token processed in them; None where not measured."""
        tokens = sum(p.tokens for p in self.energy)
        joules = sum(p.energy_j for p in self.energy)
        return joules / tokens if tokens and joules > 0 else None

    @property
    def extension(self) -> dict[str, Any]:
        value = self.server_info.get("fairserve")
        return value if isinstance(value, dict) else {}


def sweep(url: str, options: SweepOptions, progress: ProgressFn | None = None) -> SweepResult:
    """:func:`run_sweep` in a fresh event loop."""
    return asyncio.run(run_sweep(url, options, progress))


async def run_sweep(
    url: str, options: SweepOptions, progress: ProgressFn | None = None
) -> SweepResult:
    if options.request_timeout_s <= 0:
        raise ConfigError(f"timeout: expected a positive number, got {options.request_timeout_s}")
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        client = WorkerClient(session, url, options.request_timeout_s)
        info = await client.server_info()
        limits = WorkerLimits.from_server_info(info)
        timing = await _timing(client, options.timing)
        plan = make_plan(limits, options.quick, timing == "client")
        result = SweepResult(client.url, info, limits, timing, plan, [])
        rng = random.Random(options.seed)
        ctx = PointContext(client, rng, limits.speed, options.request_timeout_s)
        enabled = options.sample_gpu
        if enabled is None:
            enabled = is_local(client.url) and result.extension.get("engine") != "sim"
        sampler = NvmlSampler(
            options.nvml, options.gpu_index, options.sample_interval_s, enabled=enabled
        )
        with sampler:
            try:
                await _Driver(ctx, result, sampler, progress).run()
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionError) as exc:
                raise WorkerUnreachable(f"{client.url}: lost the worker mid-sweep: {exc}") from None
            except TimeoutError:
                raise WorkerError(
                    f"{client.url}: a request took longer than {options.request_timeout_s:g} s "
                    "(--timeout)"
                ) from None
        result.gpu = sampler.identity
        result.slowdowns = sampler.slowdowns
    result.wall_s = time.monotonic() - started
    return result


def is_local(url: str) -> bool:
    """Whether the worker runs on this host, so that this host's GPUs are its GPUs."""
    host = urlsplit(url.strip()).hostname or ""
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _timing(client: WorkerClient, choice: TimingChoice) -> Timing:
    has_counters = await client.counters() is not None
    if choice == "engine" and not has_counters:
        raise WorkerError(
            f"{client.url}: --timing engine needs the worker's step counters "
            "(/fairserve/worker/state); use --timing client for a plain SGLang worker"
        )
    if choice == "client" or not has_counters:
        return "client"
    return "engine"


class _Driver:
    """Runs a plan's points in order, feeding progress and the GPU sampler."""

    def __init__(
        self,
        ctx: PointContext,
        result: SweepResult,
        sampler: NvmlSampler,
        progress: ProgressFn | None,
    ) -> None:
        self.ctx = ctx
        self.result = result
        self.sampler = sampler
        self.progress = progress
        self.done = 0

    def _tick(self, units: int, label: str) -> None:
        self.done += units
        if self.progress is not None:
            self.progress(self.done, self.result.plan.units, label)

    async def run(self) -> None:
        plan, engine = self.result.plan, self.result.timing == "engine"
        for tokens in plan.warmup_tokens:
            await self.ctx.wait_idle(engine)
            warm = min(tokens, self.result.limits.max_batch_tokens)
            await self.ctx.client.generate(self.ctx.prompt(warm), 4)
            self._tick(1, "warm-up")
        repeats = plan.repetitions if engine else 1  # client timing repeats inside a point
        lengths = [t for t in plan.prefill_tokens for _ in range(repeats)]
        self.ctx.rng.shuffle(lengths)
        for tokens in lengths:
            await self._prefill(tokens, engine)
        runs = [p for p in plan.decode for _ in range(plan.decode_repetitions)]
        self.ctx.rng.shuffle(runs)
        for point in runs:
            await self._decode(point, engine)
            self._tick(1, point.label)

    async def _prefill(self, tokens: int, engine: bool) -> None:
        plan = self.result.plan
        start = await self._begin(engine)
        if engine:
            observation = await prefill_engine(self.ctx, tokens)
            units = 1
        else:
            observation = await prefill_client(self.ctx, tokens, plan.repetitions)
            units = plan.repetitions
        processed = (tokens + 1) * units  # every prompt, and its one output token
        await self._end(f"prefill {tokens}", [observation], start, processed)
        self._tick(units, f"prefill {tokens} tokens")

    async def _decode(self, point: DecodePoint, engine: bool) -> None:
        output_tokens = self._output_tokens(point)
        if output_tokens is None:
            self.result.notes.append(f"{point.label}: skipped, too little KV for a window")
            return
        start = await self._begin(engine)
        if engine:
            window_s = self.result.plan.window_wall_s
            found = await decode_engine(self.ctx, point, output_tokens, window_s)
        else:
            found = await decode_client(self.ctx, point, output_tokens)
        expected = 1 + (len(point.mixed_prefill_tokens) if engine else 0)
        self.result.dropped += max(0, expected - len(found))
        processed = point.running * (point.prompt_tokens + output_tokens)  # runs to the end
        await self._end(point.label, found, start, processed)

    async def _begin(self, engine: bool) -> EngineCounters | None:
        self.sampler.begin()
        return await self.ctx.client.counters() if engine else None

    async def _end(
        self,
        label: str,
        observations: Sequence[Observation | None],
        start: EngineCounters | None,
        processed_tokens: int,
    ) -> None:
        """Attach the point's GPU summary to its observations and book its energy against
        the tokens the worker processed during the point (counted by the engine where it
        can: an engine-timed decode run is cut short)."""
        gpu = self.sampler.end()
        if start is not None:
            end = await self.ctx.counters()
            processed_tokens = end.prefill_tokens + end.decode_tokens
            processed_tokens -= start.prefill_tokens + start.decode_tokens
        if gpu.energy_j is not None and processed_tokens > 0:
            self.result.energy.append(PointEnergy(label, gpu.energy_j, processed_tokens))
        for observation in observations:
            if observation is None:
                self.result.dropped += 1
            else:
                self.result.observations.append(replace(observation, gpu=gpu))

    def _output_tokens(self, point: DecodePoint) -> int | None:
        """Output length of each request: enough steps for the windows, within the KV share."""
        limits = self.result.limits
        share = int(limits.kv_capacity_tokens * _KV_SHARE)
        share -= max(point.mixed_prefill_tokens, default=0)
        kv_max = share // point.running - point.prompt_tokens
        if kv_max < _MIN_DECODE_STEPS:
            return None
        if self.result.timing == "engine":  # cut once measured: room for every window
            wall_s = self.result.plan.window_wall_s * (2.5 + len(point.mixed_prefill_tokens))
        else:  # runs to the end: as long as the window and no longer
            wall_s = self.result.plan.window_wall_s * 1.2
        step_s = self._step_estimate_s(point)
        wanted = math.ceil(wall_s * limits.speed / step_s) + 2 * _MIN_DECODE_STEPS
        return max(_MIN_DECODE_STEPS, min(kv_max, wanted))

    def _step_estimate_s(self, point: DecodePoint) -> float:
        """A lower bound on a decode step (the fastest prefill step measured so far): too
        short an estimate only asks for more output tokens than the window needs."""
        times = [o.mean_step_s for o in self.result.observations if o.kind == "prefill"]
        return max(1e-4, min(times)) if times else 1e-3
