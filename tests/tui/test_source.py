"""The HTTP state source against a real router in front of simulated workers (in-process,
loopback, port 0): what one poll gathers, quantum writes, and every way a poll can fail."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import aiohttp
import pytest

from fairserve.profiling.nvml import GpuReading
from fairserve.tui.parse import parse_sglang_metrics
from fairserve.tui.source import HttpStateSource, QuantumRefused, SourceError
from tests.router.helpers import chat, get_json, post, sim_router
from tests.tui.fakes import GPUS
from tests.worker.helpers import run

TOKEN = "s3cret"


def test_one_poll_gathers_router_workers_and_gpus() -> None:
    async def body() -> None:
        async with sim_router(2, admin_token=TOKEN) as (server, session, workers):
            for i in range(4):
                headers = {"X-Fairserve-Client": f"team-{i % 2}"}
                await post(session, "/v1/chat/completions", chat(f"q {i}"), headers=headers)
            source = HttpStateSource(server.url, TOKEN, gpu_reader=lambda: GPUS)
            try:
                snapshot = await source.fetch()
            finally:
                await source.close()
        assert [c.name for c in snapshot.clients] == ["team-0", "team-1"]
        assert sum(c.finished for c in snapshot.clients) == 4
        assert {w.url for w in snapshot.workers} == {w.url for w in workers}
        for worker in snapshot.workers:
            assert worker.probe is not None and worker.probe.per_client
            assert worker.probe.kv_capacity_tokens == 4096
            assert worker.probe.speed == 200.0
        assert snapshot.local_quantum == 512.0  # nobody set one: the workers' DLPM default
        assert all(w.probe is not None and w.probe.quantum == 512.0 for w in snapshot.workers)
        assert [g.index for g in snapshot.gpus] == [0, 1, 7]

    run(body())


def test_quantum_writes_need_the_admin_token() -> None:
    async def body() -> None:
        async with sim_router(2, admin_token=TOKEN) as (server, session, _workers):
            url = server.url
            source = HttpStateSource(url, TOKEN)
            anonymous = HttpStateSource(url, None)
            wrong = HttpStateSource(url, "nope")
            try:
                view = await source.set_quanta(quantum=1024.0, worker_quantum=float("inf"))
                with pytest.raises(QuantumRefused, match="401"):
                    await anonymous.set_quanta(quantum=64.0)
                with pytest.raises(QuantumRefused, match="403: wrong admin token"):
                    await wrong.set_quanta(quantum=64.0)
                with pytest.raises(QuantumRefused, match="400"):
                    await source.set_quanta(quantum=-1.0)
            finally:
                for s in (source, anonymous, wrong):
                    await s.close()
            _, read_back = await get_json(session, "/fairserve/v1/quantum")
        assert (view.quantum, view.worker_quantum) == (1024.0, float("inf"))
        assert read_back["quantum"] == 1024.0 and read_back["worker_quantum"] == "inf"

    run(body())


def test_unreachable_router_is_a_source_error() -> None:
    async def body() -> None:
        async with sim_router(1) as (server, _session, _workers):
            url = server.url
        source = HttpStateSource(url, timeout_s=1.0)  # the router above is gone
        try:
            with pytest.raises(SourceError, match=url):
                await source.fetch()
            with pytest.raises(SourceError):
                await source.set_quanta(quantum=1.0)
        finally:
            await source.close()

    run(body())


def test_sim_worker_metrics_parse_like_sglang() -> None:
    async def body() -> None:
        async with (
            sim_router(1) as (_, _session, workers),
            aiohttp.ClientSession() as plain,
            plain.get(workers[0].url + "/metrics") as resp,
        ):
            text = await resp.text()
        probe = parse_sglang_metrics(text)
        assert (probe.running, probe.waiting) == (0, 0)
        assert probe.kv_fraction is not None and 0.0 <= probe.kv_fraction <= 1.0

    run(body())


def test_a_hanging_gpu_read_is_waited_for_once_not_stacked() -> None:
    release = threading.Event()
    calls: list[float] = []

    def stuck() -> Sequence[GpuReading]:
        calls.append(time.monotonic())
        release.wait(10)
        return GPUS

    async def body() -> None:
        async with sim_router(1) as (server, _session, _workers):
            source = HttpStateSource(server.url, timeout_s=0.2, gpu_reader=stuck)
            try:
                first = await source.fetch()
                second = await source.fetch()
                release.set()
                third = await source.fetch()
            finally:
                await source.close()
        assert first.gpus == () and second.gpus == ()  # still reading: nothing yet
        assert len(third.gpus) == 3
        assert len(calls) == 1  # one NVML read in flight at a time

    try:
        run(body())
    finally:
        release.set()


def test_a_failing_gpu_reader_means_no_gpus() -> None:
    def broken() -> Sequence[GpuReading]:
        raise RuntimeError("driver gone")

    async def body() -> None:
        async with sim_router(1) as (server, _session, _workers):
            source = HttpStateSource(server.url, gpu_reader=broken)
            try:
                snapshot = await source.fetch()
            finally:
                await source.close()
        assert snapshot.gpus == () and snapshot.workers

    run(body())
