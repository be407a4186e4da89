"""Aborts, disconnects, refusals and failures: nothing keeps running for nobody."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from fairserve.core.cost import PiecewiseLinearBatchTime
from fairserve.sim.engine import Engine
from fairserve.worker.config import WorkerConfig, build_engine
from fairserve.worker.server import WorkerServer
from tests.worker import helpers

LONG = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 100_000 // 50}}
"""Runs for seconds of wall time at speed 1 (2000 steps of 20 ms)."""


def slow_config(**overrides: object) -> WorkerConfig:
    return helpers.make_config(speed=1.0, **overrides)


def engine_idle(server: WorkerServer) -> bool:
    runtime = helpers.runtime_of(server)
    return not runtime.engine.has_work and runtime.in_flight() == 0


def test_abort_request_ends_a_running_request_with_an_abort_finish() -> None:
    async def body() -> None:
        async with helpers.serving(slow_config()) as (server, session):
            pending = asyncio.create_task(
                helpers.post_json(session, "/generate", {**LONG, "rid": "a1"})
            )
            await helpers.wait_until(
                lambda: helpers.runtime_of(server).engine.running != [], what="admission"
            )
            status, out = await helpers.post_json(session, "/abort_request", {"rid": "a1"})
            assert (status, out) == (200, {"aborted": 1})
            status, result = await pending
            assert status == 200
            assert result["meta_info"]["finish_reason"]["type"] == "abort"
            assert engine_idle(server)
            assert helpers.runtime_of(server).engine.stats.aborted == 1
            assert await helpers.post_json(session, "/abort_request", {"rid": "a1"}) == (
                200,
                {"aborted": 0},
            )
            status, error = await helpers.post_json(session, "/abort_request", {"rid": 5})
            assert status == 400
            assert "rid: expected a non-empty string" in error["error"]["message"]

    helpers.run(body())


def test_client_disconnect_while_waiting_aborts_the_request() -> None:
    async def body() -> None:
        async with helpers.serving(slow_config()) as (server, session):
            async with aiohttp.ClientSession(base_url=server.url) as client:
                task = asyncio.create_task(helpers.post_json(client, "/generate", LONG))
                await helpers.wait_until(
                    lambda: helpers.runtime_of(server).engine.running != [], what="admission"
                )
                task.cancel()  # the client gives up and its connection closes
            await helpers.wait_until(lambda: engine_idle(server), what="abort after disconnect")
            assert helpers.runtime_of(server).engine.stats.aborted == 1
            assert (await helpers.get_json(session, "/health"))[0] == 200

    helpers.run(body())


def test_client_disconnect_while_streaming_aborts_the_request() -> None:
    async def body() -> None:
        async with helpers.serving(slow_config()) as (server, _session):
            async with aiohttp.ClientSession(base_url=server.url) as client:
                resp = await client.post("/generate", json={**LONG, "stream": True})
                first = await resp.content.readline()
                assert first.startswith(b"data: ")
                resp.close()  # drop the connection mid-stream
            await helpers.wait_until(lambda: engine_idle(server), what="abort after disconnect")
            assert helpers.runtime_of(server).engine.stats.aborted == 1

    helpers.run(body())


def test_duplicate_in_flight_rid_is_refused() -> None:
    async def body() -> None:
        async with helpers.serving(slow_config()) as (server, session):
            task = asyncio.create_task(
                helpers.post_json(session, "/generate", {**LONG, "rid": "dup"})
            )
            await helpers.wait_until(
                lambda: helpers.runtime_of(server).in_flight() == 1, what="submission"
            )
            status, error = await helpers.post_json(session, "/generate", {**LONG, "rid": "dup"})
            assert status == 400
            assert "rid 'dup': a request with this id is in flight" in error["error"]["message"]
            await helpers.post_json(session, "/abort_request", {"rid": "dup"})
            await task

    helpers.run(body())


def test_flush_cache_is_refused_while_requests_run() -> None:
    async def body() -> None:
        async with helpers.serving(slow_config()) as (server, session):
            task = asyncio.create_task(
                helpers.post_json(session, "/generate", {**LONG, "rid": "f"})
            )
            await helpers.wait_until(
                lambda: helpers.runtime_of(server).in_flight() == 1, what="submission"
            )
            async with session.post("/flush_cache") as resp:
                assert resp.status == 400
                assert "requests are waiting or running" in (await resp.json())["error"]["message"]
            await helpers.post_json(session, "/abort_request", {"rid": "f"})
            await task

    helpers.run(body())


def test_rate_limited_client_gets_429_with_retry_after() -> None:
    async def body() -> None:
        config = helpers.make_config(policy="rpm", policy_params={"limit_per_min": 1}, speed=1.0)
        async with helpers.serving(config) as (_, session):
            request = {
                "text": "hi",
                "routing_key": "greedy",
                "sampling_params": {"max_new_tokens": 1},
            }
            assert (await helpers.post_json(session, "/generate", request))[0] == 200
            async with session.post(
                "/v1/completions", json={"prompt": "hi", "user": "greedy"}
            ) as resp:
                assert resp.status == 429
                assert int(resp.headers["Retry-After"]) >= 1
                error = (await resp.json())["error"]
                assert error["type"] == "rate_limit_error"
                assert "client 'greedy'" in error["message"]
            other = {**request, "routing_key": "polite"}
            assert (await helpers.post_json(session, "/generate", other))[0] == 200

    helpers.run(body())


def test_a_request_that_can_never_fit_is_a_400() -> None:
    async def body() -> None:
        async with helpers.serving() as (_, session):
            status, error = await helpers.generate(session, 5000, input_ids=[1] * 100)
            assert status == 400
            assert "However, you requested 5100 tokens" in error["error"]["message"]

    helpers.run(body())


def test_malformed_requests_and_unknown_routes_answer_json() -> None:
    async def body() -> None:
        async with helpers.serving() as (_, session):
            async with session.post("/generate", data=b"{not json") as resp:
                assert resp.status == 400
                assert "not valid JSON" in (await resp.json())["error"]["message"]
            status, error = await helpers.post_json(
                session, "/v1/chat/completions", {"messages": "hi"}
            )
            assert (status, error["error"]["type"]) == (400, "invalid_request_error")
            assert (await helpers.get_json(session, "/no/such/route"))[0] == 404
            status, error = await helpers.get_json(session, "/generate")
            assert status == 405
            assert error["error"]["code"] == 405

    helpers.run(body())


class _FailOnceTimeModel(PiecewiseLinearBatchTime):
    """A batch-time model whose first call raises: a bug inside a step."""

    failed = False

    def batch_time_s(self, token_load: int, context_tokens: int = 0) -> float:
        if not _FailOnceTimeModel.failed:
            _FailOnceTimeModel.failed = True
            raise RuntimeError("boom")
        return super().batch_time_s(token_load, context_tokens)


def _failing_engine(config: WorkerConfig) -> Engine:
    engine = build_engine(config)
    engine.time_model = _FailOnceTimeModel(c_s=0.02, a_s_per_token=0.0, b0_tokens=0)
    return engine


def test_an_engine_failure_fails_in_flight_requests_and_the_worker_goes_on() -> None:
    async def body() -> None:
        _FailOnceTimeModel.failed = False
        async with helpers.serving(engine_factory=_failing_engine) as (server, session):
            request = {"text": "hello", "sampling_params": {"max_new_tokens": 3}}
            status, error = await helpers.post_json(session, "/generate", request)
            assert status == 500
            message = error["error"]["message"]
            assert message.startswith("the simulated engine failed (error id ")
            assert "boom" not in message and "RuntimeError" not in message  # in the log only
            assert (await helpers.get_json(session, "/health"))[0] == 200
            assert (await helpers.post_json(session, "/generate", request))[0] == 200
            _, state = await helpers.get_json(session, "/fairserve/worker/state")
            assert state["engine"]["errors"] == 1
            assert helpers.runtime_of(server).engine.stats.finished == 1  # a fresh engine took over

    helpers.run(body())


def test_at_speed_one_wall_latency_matches_simulated_latency() -> None:
    """The loop sleeps to absolute deadlines, so wall time tracks simulated time; when the
    host falls behind, the slip it reports accounts for the difference."""

    async def body() -> None:
        async with helpers.serving(slow_config()) as (server, session):
            request = {"input_ids": list(range(50)), "sampling_params": {"max_new_tokens": 20}}
            start = time.monotonic()
            status, out = await helpers.post_json(session, "/generate", request)
            wall_s = time.monotonic() - start
            simulated_s = out["meta_info"]["e2e_latency"]
            assert status == 200
            assert simulated_s >= 20 * 0.02  # 20 steps of at least c_s
            expected_s = (
                simulated_s + helpers.runtime_of(server).slip_s
            )  # speed 1: slip is wall time
            assert abs(wall_s - expected_s) < 0.05 + 0.1 * simulated_s, (wall_s, simulated_s)

    helpers.run(body())


def test_shutdown_aborts_what_is_still_running() -> None:
    async def body() -> None:
        server = WorkerServer(slow_config(), "127.0.0.1", 0, grace_s=0.2)
        url = await server.start()
        async with aiohttp.ClientSession(base_url=url) as client:
            async with client.post("/generate", json={**LONG, "stream": True}) as resp:
                await resp.content.readline()
                stopping = asyncio.create_task(server.stop())
                events = await helpers.sse_events(resp)
            await stopping
        finals = [e for e in events if isinstance(e, dict) and e["meta_info"]["finish_reason"]]
        assert finals[-1]["meta_info"]["finish_reason"]["type"] == "abort"
        assert events[-1] == "[DONE]"

    helpers.run(body())


def test_a_dead_engine_loop_fails_health_and_refuses_work() -> None:
    async def body() -> None:
        async with helpers.serving() as (server, session):
            await helpers.runtime_of(server).stop()
            status, error = await helpers.get_json(session, "/health")
            assert (status, error["error"]["message"]) == (503, "engine loop is not running")
            status, error = await helpers.post_json(session, "/generate", {"text": "hi"})
            assert status == 503

    helpers.run(body())
