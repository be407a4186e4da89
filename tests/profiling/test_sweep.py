"""The sweep driver against real simulated workers with known profiles (in-process).

Engine timing must recover every shipped profile: the worker's step counters are exact, so
this holds on a loaded machine. Client timing runs at speed 1 (the way a real GPU runs), so
its precision depends on wall-clock jitter against 20 ms steps.
"""

from __future__ import annotations

import asyncio

import pytest

from fairserve.profiling.client import WorkerError
from fairserve.profiling.fit import fit_observations
from fairserve.profiling.sweep import SweepOptions, SweepResult, is_local, run_sweep
from fairserve.sim.profile import Profile, shipped_profiles
from tests.fakes.nvml import FakeGpu, FakeNvml
from tests.profiling.helpers import run, truth_profile, worker

QUICK = SweepOptions(quick=True, sample_gpu=False)


async def _sweep(
    profile: Profile, options: SweepOptions = QUICK, speed: float = 50.0
) -> SweepResult:
    async with worker(profile, speed) as server:
        return await run_sweep(server.url, options)


def _assert_recovers(profile: Profile, result: SweepResult, rel: float) -> None:
    fit = fit_observations(result.observations)
    constant = profile.c_s + profile.step_overhead_s  # what step times can see
    assert fit.constant_s == pytest.approx(constant, rel=rel)
    assert fit.a_s_per_token == pytest.approx(profile.a_s_per_token, rel=rel)
    assert fit.b0_tokens == pytest.approx(profile.b0_tokens, rel=rel)
    assert fit.attention_s_per_token == pytest.approx(profile.attention_s_per_token, rel=rel)
    assert fit.r2 > 0.999


@pytest.mark.parametrize("profile", shipped_profiles(), ids=lambda p: p.name)
def test_engine_timing_recovers_every_shipped_profile(profile: Profile) -> None:
    result = run(_sweep(profile))

    assert result.timing == "engine"
    assert result.limits.speed == 50.0
    kinds = {o.kind for o in result.observations}
    assert kinds == {"prefill", "decode", "mixed"}
    _assert_recovers(profile, result, rel=0.01)
    assert result.wall_s < 20.0


def test_client_timing_recovers_a_profile_at_speed_one() -> None:
    profile = truth_profile()
    options = SweepOptions(quick=True, timing="client", sample_gpu=False)

    result = run(_sweep(profile, options, speed=1.0))

    assert result.timing == "client"
    assert all(o.timing == "client" for o in result.observations)
    assert {o.kind for o in result.observations} == {"prefill", "decode"}
    fit = fit_observations(result.observations)
    assert fit.constant_s == pytest.approx(profile.c_s, rel=0.05)
    assert fit.a_s_per_token == pytest.approx(profile.a_s_per_token, rel=0.05)
    assert fit.b0_tokens == pytest.approx(profile.b0_tokens, rel=0.05)
    # attention is estimated from approximate window contexts: the right order only
    assert fit.attention_s_per_token == pytest.approx(profile.attention_s_per_token, rel=0.5)


def test_gpu_samples_ride_along_and_survive_nvml_failing_mid_sweep() -> None:
    nvml = FakeNvml(
        gpus=[FakeGpu(power_w=250.0)],
        fail_after={"nvmlDeviceGetTotalEnergyConsumption": 20, "nvmlDeviceGetClockInfo": 30},
    )
    # The thread never fires: begin/end reads only, so the failures land at fixed points.
    options = SweepOptions(quick=True, nvml=nvml, sample_gpu=True, sample_interval_s=60.0)

    result = run(_sweep(truth_profile(), options))

    assert result.gpu is not None and result.gpu.driver_version == "550.54.15"
    energies = [o.gpu.energy_j for o in result.observations]
    clocks = [o.gpu.mean_sm_clock_mhz for o in result.observations]
    assert all(e is not None and e > 0 for e in energies)  # counter, then ∫ power dt
    assert clocks[0] == 1980.0 and clocks[-1] is None  # the clock read broke mid-sweep
    # energy is booked per point against the tokens the engine processed in it
    plan = result.plan
    points = len(plan.prefill_tokens) * plan.repetitions + len(plan.decode)
    assert len(result.energy) == points
    for point in result.energy:
        if point.label.startswith("prefill "):
            assert point.tokens == int(point.label.split()[1]) + 1  # prompt + its one token
    assert result.joules_per_token is not None and result.joules_per_token > 0
    _assert_recovers(truth_profile(), result, rel=0.01)  # timing never depended on NVML


def test_nvml_that_cannot_start_leaves_gpu_fields_n_a() -> None:
    options = SweepOptions(quick=True, nvml=FakeNvml(init_fails=True), sample_gpu=True)
    seen: list[tuple[int, int, str]] = []

    async def body() -> SweepResult:
        async with worker(truth_profile()) as server:
            return await run_sweep(server.url, options, lambda *tick: seen.append(tick))

    result = run(body())
    assert result.gpu is None
    assert result.joules_per_token is None
    done = [d for d, _, _ in seen]
    assert done == sorted(done) and seen[-1][:2] == (result.plan.units, result.plan.units)
    assert all(o.gpu.energy_j is None for o in result.observations)


def test_engine_timing_is_refused_by_a_worker_without_counters() -> None:
    """A worker that answers but has no /fairserve/worker/state (plain SGLang)."""
    from aiohttp import web

    async def body() -> None:
        app = web.Application()

        async def info(request: web.Request) -> web.Response:
            return web.json_response({"max_total_num_tokens": 1000, "chunked_prefill_size": 64})

        app.router.add_get("/get_server_info", info)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            with pytest.raises(WorkerError, match="--timing client"):
                await run_sweep(f"http://127.0.0.1:{port}", SweepOptions(timing="engine"))
        finally:
            await runner.cleanup()

    run(body())


def test_other_traffic_during_a_point_is_dropped_not_fitted() -> None:
    """A second client hammering the worker: points whose counters show foreign steps are
    dropped, and what is kept still fits the truth."""
    from fairserve.profiling.client import WorkerClient

    profile = truth_profile()

    async def body() -> SweepResult:
        import aiohttp

        async with worker(profile) as server, aiohttp.ClientSession() as session:
            intruder = WorkerClient(session, server.url, 30.0)
            stop = asyncio.Event()

            async def noise() -> None:
                while not stop.is_set():
                    await intruder.generate(list(range(100, 140)), 1)
                    await asyncio.sleep(0.02)

            task = asyncio.create_task(noise())
            try:
                return await run_sweep(server.url, QUICK)
            finally:
                stop.set()
                await task

    result = run(body())
    assert result.dropped > 0
    _assert_recovers(profile, result, rel=0.01)


def test_a_worker_that_goes_away_mid_sweep_is_unreachable() -> None:
    from fairserve.profiling.client import WorkerUnreachable

    async def body() -> None:
        async with worker(truth_profile()) as server:
            url = server.url
            sweeping = asyncio.create_task(run_sweep(url, QUICK))
            while not sweeping.done() and server.runtime is not None:
                if server.runtime.engine.stats.steps > 20:  # well into the prefill points
                    break
                await asyncio.sleep(0.005)
        # refused connections, or 503s while it drains: both mean "unavailable" (exit 3)
        with pytest.raises(WorkerUnreachable, match=r"lost the worker|worker unavailable"):
            await sweeping

    run(body())


def test_gpu_sampling_is_off_by_default_for_a_simulated_worker() -> None:
    """NVML on this host would describe an idle GPU, not the simulated one."""
    nvml = FakeNvml()
    result = run(_sweep(truth_profile(), SweepOptions(quick=True, nvml=nvml)))
    assert result.gpu is None and nvml.inits == 0


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:30000", True),
        ("http://localhost:8000/", True),
        ("http://[::1]:30000", True),
        ("http://10.0.0.7:30000", False),
        ("http://gpu-box.example:30000", False),
    ],
)
def test_which_urls_are_this_host(url: str, local: bool) -> None:
    assert is_local(url) is local
