"""Info, health, metrics and the fairserve extension over real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from fairserve.worker.config import WorkerConfig
from tests.api.servers import serving_beyond_loopback
from tests.worker import helpers

SGLANG_METRICS = {
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:cache_hit_rate",
    "sglang:token_usage",
    "sglang:prompt_tokens",
    "sglang:generation_tokens",
    "sglang:num_requests",
    "sglang:e2e_request_latency_seconds",
    "sglang:time_to_first_token_seconds",
}


def test_health_info_and_models() -> None:
    async def body() -> None:
        async with helpers.serving(helpers.make_config(model_name="sim-8b")) as (_, session):
            assert (await helpers.get_json(session, "/health"))[0] == 200
            assert (await helpers.get_json(session, "/health_generate"))[0] == 200
            for path in ("/get_server_info", "/server_info"):
                status, info = await helpers.get_json(session, path)
                assert status == 200
                assert info["max_total_num_tokens"] == 4096
                assert info["chunked_prefill_size"] == 512
                # The bounded running batch: the tokens at which the tiny profile's step
                # takes 2 one-token steps (2,064) over the 5 a running request brings.
                assert info["max_running_requests"] == 413
                assert info["model_path"] == "sim-8b"
                assert info["fairserve"] == {
                    "engine": "sim",
                    "policy": "dlpm",
                    "quantum": 512.0,
                    "profile": "tiny",
                    "gpu": "Test GPU",
                    "model": "test/model",
                    "capacity_tokens_per_s": helpers.tiny_profile().capacity_tokens_per_s,
                    "speed": 50.0,
                    "batching": "sarathi",
                }
            for path in ("/get_model_info", "/model_info"):
                _, model = await helpers.get_json(session, path)
                assert model["model_path"] == "sim-8b"
                assert model["is_generation"] is True
            _, models = await helpers.get_json(session, "/v1/models")
            assert [m["id"] for m in models["data"]] == ["sim-8b"]
            _, load = await helpers.get_json(session, "/get_load")
            assert load == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]

    helpers.run(body())


def test_metrics_parse_and_carry_sglang_names() -> None:
    async def body() -> None:
        async with helpers.serving() as (_, session):
            request = {"text": "one two three", "sampling_params": {"max_new_tokens": 4}}
            for _ in range(2):
                assert (await helpers.post_json(session, "/generate", request))[0] == 200
            async with session.get("/metrics") as resp:
                assert resp.status == 200
                text = await resp.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert set(families) >= SGLANG_METRICS
        samples = {s.name: s for f in families.values() for s in f.samples}
        assert samples["sglang:num_requests_total"].value == 2
        assert samples["sglang:generation_tokens_total"].value == 8
        assert samples["sglang:prompt_tokens_total"].value == 6
        assert samples["sglang:cache_hit_rate"].value == 2 / 6
        assert samples["sglang:e2e_request_latency_seconds_count"].value == 2
        assert samples["sglang:num_running_reqs"].labels == {"model_name": "fairserve-sim"}

    helpers.run(body())


def test_state_reports_policy_engine_and_clients() -> None:
    async def body() -> None:
        async with helpers.serving() as (_, session):
            request = {
                "text": "a b c",
                "routing_key": "alice",
                "sampling_params": {"max_new_tokens": 2},
            }
            await helpers.post_json(session, "/generate", request)
            status, state = await helpers.get_json(session, "/fairserve/worker/state")
            assert status == 200
            assert state["policy"]["policy"] == "dlpm"
            assert state["policy"]["clients"]["alice"]["service"] > 0
            assert state["engine"]["finished"] == 1
            assert (state["waiting"], state["running"], state["clients"]) == (0, 0, {})
            assert state["kv"]["capacity_tokens"] == 4096
            assert state["profile"]["name"] == "tiny"
            assert (state["speed"], state["batching"]) == (50.0, "sarathi")
            assert state["virtual_time_s"] > 0

    helpers.run(body())


def test_quantum_can_be_read_and_changed_live() -> None:
    async def body() -> None:
        async with helpers.serving() as (server, session):
            assert await helpers.get_json(session, "/fairserve/worker/quantum") == (
                200,
                {"policy": "dlpm", "quantum": 512.0},
            )
            async with session.put("/fairserve/worker/quantum", json={"quantum": 64}) as resp:
                assert (resp.status, await resp.json()) == (
                    200,
                    {"policy": "dlpm", "quantum": 64.0},
                )
            assert helpers.runtime_of(server).engine.policy.quantum == 64.0
            for bad, message in ((0, "quantum"), ("big", "expected a positive number")):
                async with session.put("/fairserve/worker/quantum", json={"quantum": bad}) as resp:
                    assert resp.status == 400
                    assert message in (await resp.json())["error"]["message"]

    helpers.run(body())


def test_quantum_of_a_policy_without_one_is_a_400() -> None:
    async def body() -> None:
        async with helpers.serving(helpers.make_config(policy="vtc")) as (_, session):
            assert (await helpers.get_json(session, "/fairserve/worker/quantum"))[1][
                "quantum"
            ] is None
            async with session.put("/fairserve/worker/quantum", json={"quantum": 8}) as resp:
                assert resp.status == 400
                assert (await resp.json())["error"]["message"] == "policy vtc has no quantum"

    helpers.run(body())


def test_quantum_writes_need_the_admin_token_when_one_is_set() -> None:
    """401 without a bearer token, 403 with a wrong one: the router's answers (api.auth)."""

    async def body() -> None:
        async with helpers.serving(helpers.make_config(admin_token="s3cret")) as (_, session):
            path, change = "/fairserve/worker/quantum", {"quantum": 32}
            for headers in ({}, {"Authorization": "s3cret"}):
                async with session.put(path, json=change, headers=headers) as resp:
                    assert resp.status == 401
                    assert "admin token required" in (await resp.json())["error"]["message"]
            wrong = {"Authorization": "Bearer wrong"}
            async with session.put(path, json=change, headers=wrong) as resp:
                assert resp.status == 403
                assert (await resp.json())["error"]["message"] == "wrong admin token"
            assert (await helpers.get_json(session, path))[0] == 200  # reads stay open
            auth = {"Authorization": "Bearer s3cret"}
            async with session.put(path, json=change, headers=auth) as resp:
                assert resp.status == 200

    helpers.run(body())


def test_weights_can_be_read_and_changed_live_with_the_admin_token() -> None:
    async def body() -> None:
        async with helpers.serving(helpers.make_config(admin_token="s3cret")) as (server, session):
            path, auth = "/fairserve/worker/weights", {"Authorization": "Bearer s3cret"}
            assert await helpers.get_json(session, path) == (200, {"policy": "dlpm", "weights": {}})
            async with session.put(path, json={"client": "a", "weight": 3}) as resp:
                assert resp.status == 401
            async with session.put(path, json={"client": "a", "weight": 3}, headers=auth) as resp:
                assert (resp.status, await resp.json()) == (
                    200,
                    {"policy": "dlpm", "weights": {"a": 3.0}},
                )
            assert helpers.runtime_of(server).engine.policy.weight("a") == 3.0
            bad_bodies = (
                ({"client": "a", "weight": 0}, "weight"),
                ({"client": "a", "weight": "x"}, "weight: expected a positive number"),
                ({"client": "", "weight": 1}, "client: expected a non-empty string"),
                ({"client": "a", "weight": 1, "w": 2}, "w: unknown field"),
            )
            for bad, message in bad_bodies:
                async with session.put(path, json=bad, headers=auth) as resp:
                    assert resp.status == 400
                    assert message in (await resp.json())["error"]["message"]

    helpers.run(body())


def test_evictions_appear_once_the_cache_is_full() -> None:
    """A 256-token pool: distinct 60-token prompts fill it, and old prefixes get evicted."""

    async def body() -> None:
        config = helpers.make_config(profile=helpers.tiny_profile(kv_capacity_tokens=256))
        async with helpers.serving(config) as (_, session):
            assert await helpers.get_json(session, "/fairserve/worker/evictions") == (
                200,
                {"next": 0, "events": [], "dropped": False},
            )
            prompts = [[1000 * i + j for j in range(60)] for i in range(8)]
            for ids in prompts:
                assert (await helpers.generate(session, 2, input_ids=ids))[0] == 200
            _, page = await helpers.get_json(session, "/fairserve/worker/evictions?since=0")
            assert page["events"], "nothing was evicted"
            assert page["next"] == page["events"][-1]["seq"] + 1
            evicted = page["events"][0]["tokens"]
            assert evicted[:60] == prompts[0]  # the oldest prompt (and its output) went first
            _, later = await helpers.get_json(
                session, f"/fairserve/worker/evictions?since={page['next']}"
            )
            assert later == {"next": page["next"], "events": [], "dropped": False}
            status, error = await helpers.get_json(session, "/fairserve/worker/evictions?since=-1")
            assert status == 400
            assert "since: expected a non-negative integer" in error["error"]["message"]

    helpers.run(body())


def test_flush_cache_empties_the_cache_and_logs_a_flush() -> None:
    async def body() -> None:
        async with helpers.serving() as (server, session):
            await helpers.generate(session, 2, input_ids=[1, 2, 3, 4])
            assert helpers.runtime_of(server).engine.pool.used_tokens > 0
            async with session.post("/flush_cache") as resp:
                assert resp.status == 200
            assert helpers.runtime_of(server).engine.pool.used_tokens == 0
            _, page = await helpers.get_json(session, "/fairserve/worker/evictions")
            assert page["events"][-1]["tokens"] == []  # empty key: everything was flushed

    helpers.run(body())


@asynccontextmanager
async def beyond_loopback(config: WorkerConfig) -> AsyncIterator[aiohttp.ClientSession]:
    """A session to a worker that believes it listens beyond loopback (``tests.api.servers``)."""
    async with serving_beyond_loopback(config) as (url, _):
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(base_url=url, timeout=timeout) as session:
            yield session


def test_control_beyond_loopback_needs_the_admin_token() -> None:
    """``/abort_request`` and ``/flush_cache`` end other tenants' work: 401 without the
    token, 403 with a wrong one, served with the right one."""
    auth = {"Authorization": "Bearer s3cret"}

    async def body() -> None:
        async with beyond_loopback(helpers.make_config(admin_token="s3cret")) as session:
            calls: tuple[tuple[str, str, dict[str, Any] | None], ...] = (
                ("POST", "/abort_request", {"rid": "nobody"}),
                ("POST", "/abort_request", {"abort_all": True}),
                ("POST", "/flush_cache", {}),
                ("GET", "/flush_cache", None),
            )
            for method, path, payload in calls:
                answers = []
                for headers in ({}, {"Authorization": "Bearer wrong"}, auth):
                    async with session.request(method, path, json=payload, headers=headers) as resp:
                        answers.append((resp.status, (await resp.json())))
                assert [status for status, _ in answers] == [401, 403, 200], path
                assert answers[0][1]["error"]["type"] == "authentication_error"
                assert answers[1][1]["error"]["message"] == "wrong admin token"

    helpers.run(body())


def test_beyond_loopback_without_a_token_every_write_is_refused() -> None:
    async def body() -> None:
        async with beyond_loopback(helpers.make_config()) as session:
            writes: tuple[tuple[str, str, dict[str, Any]], ...] = (
                ("POST", "/abort_request", {"abort_all": True}),
                ("POST", "/flush_cache", {}),
                ("PUT", "/fairserve/worker/quantum", {"quantum": 8}),
                ("PUT", "/fairserve/worker/weights", {"client": "a", "weight": 2}),
            )
            for method, path, payload in writes:
                async with session.request(method, path, json=payload) as resp:
                    assert resp.status == 403, path
                    message = (await resp.json())["error"]["message"]
                    assert message.startswith("writes are disabled: start the worker with")
            assert (await helpers.get_json(session, "/fairserve/worker/quantum"))[0] == 200  # reads

    helpers.run(body())


def test_control_on_loopback_stays_open_with_a_token_set() -> None:
    """SGLang's behaviour, kept on loopback: the local router aborts without a token."""

    async def body() -> None:
        async with helpers.serving(helpers.make_config(admin_token="s3cret")) as (_, session):
            assert (await helpers.post_json(session, "/abort_request", {"rid": "nobody"})) == (
                200,
                {"aborted": 0},
            )
            async with session.post("/flush_cache") as resp:
                assert resp.status == 200

    helpers.run(body())
