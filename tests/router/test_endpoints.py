"""Every router endpoint against two simulated workers: answers, usage, identity, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from fairserve.router.config import load_clients
from tests.router.helpers import chat, get_json, post, routed, sim_router
from tests.worker.helpers import run, sse_events


def _usage_ok(usage: dict[str, Any]) -> None:
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] == 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + 4
    assert "cached_tokens" in usage["prompt_tokens_details"]


def test_chat_completion_and_generate_non_streaming() -> None:
    async def body() -> None:
        async with sim_router() as (_, session, _):
            status, answer, _ = await post(session, "/v1/chat/completions", chat())
            assert status == 200, answer
            assert answer["object"] == "chat.completion"
            _usage_ok(answer["usage"])
            status, answer, _ = await post(
                session, "/v1/completions", {"prompt": "once upon", "max_tokens": 4}
            )
            assert status == 200 and answer["choices"][0]["text"]
            _usage_ok(answer["usage"])
            native = {"text": "hi there", "sampling_params": {"max_new_tokens": 4}}
            status, answer, _ = await post(session, "/generate", native)
            assert status == 200 and answer["meta_info"]["completion_tokens"] == 4

    run(body())


def test_streams_strip_or_keep_the_usage_chunk() -> None:
    async def body() -> None:
        async with sim_router() as (_, session, _):
            async with session.post("/v1/chat/completions", json=chat(stream=True)) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                events = await sse_events(resp)
            assert events[-1] == "[DONE]"
            assert not any("usage" in e for e in events[:-1]), "client did not ask for usage"
            text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
            assert len(text.split()) == 4
            wanted = chat(stream=True, stream_options={"include_usage": True})
            async with session.post("/v1/chat/completions", json=wanted) as resp:
                events = await sse_events(resp)
            assert events[-2]["choices"] == []
            _usage_ok(events[-2]["usage"])
            native = {"text": "hi", "sampling_params": {"max_new_tokens": 4}, "stream": True}
            async with session.post("/generate", json=native) as resp:
                events = await sse_events(resp)
            assert events[-1] == "[DONE]" and events[-2]["meta_info"]["completion_tokens"] == 4
            _, state = await get_json(session, "/fairserve/v1/state")
            client = state["clients"]["anonymous"]
            assert client["finished"] == 3 and client["output_tokens"] == 12
            assert client["ttft_p50_s"] is not None

    run(body())


def test_models_health_and_state_keys() -> None:
    async def body() -> None:
        async with sim_router() as (server, session, workers):
            status, models = await get_json(session, "/v1/models")
            assert status == 200 and [m["id"] for m in models["data"]] == ["fairserve-sim"]
            assert (await get_json(session, "/health"))[0] == 200
            await post(session, "/v1/chat/completions", chat(), headers={"X-Fairserve-Client": "a"})
            status, state = await get_json(session, "/fairserve/v1/state")
            assert status == 200
            for key in ("router", "quantum", "jain_index", "clients", "workers", "dispatcher"):
                assert key in state
            assert state["router"]["url"] == server.url
            a = state["clients"]["a"]
            for key in ("service", "service_rate", "latency_p99_s", "ttft_p50_s", "deficits"):
                assert key in a
            assert a["service"] == a["prompt_tokens"] + 2 * a["output_tokens"]
            assert set(a["deficits"]) == {w.url for w in workers}
            assert {w["fairness"] for w in state["workers"]} == {"inside"}
            assert all(w["healthy"] and w["extension"] for w in state["workers"])
            # The simulated workers report their profile's capacity through get_server_info.
            assert all(w["capacity_tokens_per_s"] > 0 for w in state["workers"])

    run(body())


def test_identity_precedence_and_unknown_key(tmp_path: Path) -> None:
    path = tmp_path / "clients.toml"
    path.write_text('[[clients]]\nname = "alice"\napi_key = "k-a"\nweight = 2\n')
    keys, weights = load_clients(path)

    async def body() -> None:
        # trust_identity_header: without it a key is required (test_identity.py)
        trusted = sim_router(clients=keys, weights=weights, trust_identity_header=True)
        async with trusted as (_, session, workers):
            both = {"Authorization": "Bearer k-a", "X-Fairserve-Client": "bob"}
            await post(session, "/v1/chat/completions", chat(user="carol"), headers=both)
            header = {"X-Fairserve-Client": "bob"}
            await post(session, "/v1/chat/completions", chat(user="carol"), headers=header)
            await post(session, "/v1/chat/completions", chat(user="carol"))
            await post(session, "/v1/chat/completions", chat())
            _, state = await get_json(session, "/fairserve/v1/state")
            assert sorted(state["clients"]) == ["alice", "anonymous", "bob", "carol"]
            assert state["clients"]["alice"]["weight"] == 2.0
            status, error, _ = await post(
                session, "/v1/chat/completions", chat(), headers={"Authorization": "Bearer nope"}
            )
            assert status == 401 and "unknown API key" in error["error"]["message"]
            seen = [w.runtime.state()["policy"]["clients"] for w in workers if w.runtime]
            assert "alice" in {c for clients in seen for c in clients}, "routing_key forwarded"

    run(body())


def test_errors_have_the_right_status_and_message() -> None:
    async def body() -> None:
        async with sim_router(max_body_bytes=2000) as (_, session, _):
            cases: list[tuple[Any, int, str]] = [
                ({"messages": "hi"}, 400, "messages"),
                ({"max_tokens": 3}, 400, "messages"),
                (chat(max_tokens="many"), 400, "max_tokens"),
                (chat(stream="yes"), 400, "stream"),
                # An unknown model name is a 404 only with several models: test_model_names.
                ({"prompt": 5}, 400, "prompt"),
                ([1, 2], 400, "JSON object"),
                (chat(content="word " * 1000), 413, "too large"),
            ]
            for request, status, fragment in cases:
                path = "/v1/completions" if "prompt" in str(request) else "/v1/chat/completions"
                got, error, _ = await post(session, path, request)
                assert got == status, (request, error)
                assert fragment in error["error"]["message"], error
                assert error["error"]["code"] == status
            async with session.post("/v1/chat/completions", data=b"{not json") as resp:
                assert resp.status == 400
                assert "not valid JSON" in (await resp.json())["error"]["message"]
            assert (await get_json(session, "/nowhere"))[0] == 404

    run(body())


def test_queue_cap_answers_429_with_retry_after() -> None:
    async def body() -> None:
        async with sim_router(worker={"speed": 5.0}, queue_cap=1) as (_, session, _):
            slow = session.post("/v1/chat/completions", json=chat(max_tokens=50, stream=True))
            async with slow as first:
                status, error, headers = await post(session, "/v1/chat/completions", chat())
                assert status == 429 and headers["Retry-After"] == "1"
                assert "cap is 1" in error["error"]["message"]
                assert first.status == 200

    run(body())


def test_no_healthy_worker_is_503() -> None:
    async def body() -> None:
        async with routed(["http://127.0.0.1:9"]) as (_, session):
            status, error, _ = await post(session, "/v1/chat/completions", chat())
            assert status == 503 and "no healthy worker" in error["error"]["message"]
            assert (await get_json(session, "/health"))[0] == 503

    run(body())


def test_quantum_get_and_put_with_admin_token() -> None:
    async def body() -> None:
        async with sim_router(admin_token="s3cret") as (_, session, workers):
            status, view = await get_json(session, "/fairserve/v1/quantum")
            assert status == 200 and view["worker_quantum"] == 2.0**23  # the default
            async with session.put("/fairserve/v1/quantum", json={"quantum": 99}) as resp:
                assert resp.status == 401
            bad = {"Authorization": "Bearer wrong"}
            async with session.put("/fairserve/v1/quantum", json={"quantum": 9}, headers=bad) as r:
                assert r.status == 403
            ok = {"Authorization": "Bearer s3cret"}
            update = {"quantum": 99, "worker_quantum": 500}
            async with session.put("/fairserve/v1/quantum", json=update, headers=ok) as resp:
                assert resp.status == 200, await resp.text()
                view = await resp.json()
            assert view["worker_quantum"] == 500 and view["quantum"] == 99
            # Workers with the extension got Q^u (they run without an admin token here).
            assert all(w.runtime and w.runtime.engine.policy.quantum == 99 for w in workers)
            async with session.put(
                "/fairserve/v1/quantum", json={"quantum": -1}, headers=ok
            ) as resp:
                assert resp.status == 400 and "quantum" in (await resp.json())["error"]["message"]

    run(body())


def test_quantum_put_is_refused_without_a_configured_token() -> None:
    async def body() -> None:
        async with sim_router() as (_, session, _):
            ok = {"Authorization": "Bearer anything"}
            async with session.put("/fairserve/v1/quantum", json={"quantum": 9}, headers=ok) as r:
                assert r.status == 403 and "--admin-token" in (await r.json())["error"]["message"]

    run(body())


def test_metrics_parse_back() -> None:
    async def body() -> None:
        async with sim_router() as (_, session, workers):
            for client in ("a", "b"):
                headers = {"X-Fairserve-Client": client}
                await post(session, "/v1/chat/completions", chat(), headers=headers)
            async with session.get("/metrics") as resp:
                assert resp.status == 200
                text = await resp.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        service = {
            s.labels["client"]: s.value
            for s in families["fairserve_router_client_service"].samples
            if s.name.endswith("_total")
        }
        assert set(service) == {"a", "b"} and all(v > 0 for v in service.values())
        latency = families["fairserve_router_request_latency_seconds"]
        counts = [s for s in latency.samples if s.name.endswith("_count")]
        assert {s.labels["client"]: s.value for s in counts} == {"a": 1.0, "b": 1.0}
        healthy = families["fairserve_router_worker_healthy"].samples
        assert {s.labels["worker"] for s in healthy} == {w.url for w in workers}
        assert all(s.value == 1.0 for s in healthy)
        assert "fairserve_router_client_deficit" in families
        assert "fairserve_router_jain_index" in families

    run(body())


def test_trace_records_requests(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"

    async def body() -> None:
        async with sim_router(trace_path=str(trace)) as (_, session, _):
            await post(session, "/v1/chat/completions", chat(), headers={"X-Fairserve-App": "p1"})

    run(body())
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert lines[0]["fairserve_trace"] == 1
    assert lines[1]["client"] == "anonymous" and lines[1]["app"] == "p1"
    assert lines[1]["output_tokens"] == 4


def test_client_session_closes_cleanly() -> None:
    """The shared upstream session is closed on stop (no 'Unclosed client session')."""

    async def body() -> None:
        async with sim_router() as (server, _, _):
            session = server.router.session
            assert isinstance(session, aiohttp.ClientSession)
        assert session.closed

    run(body())


def test_a_restarted_router_keeps_the_trace_it_recorded_before(tmp_path: Path) -> None:
    """``--record`` with a path that holds a trace: the old one is renamed beside it, not
    truncated (a router restarted with the same options used to erase its recording)."""
    trace = tmp_path / "trace.jsonl"

    async def one_run(client: str) -> None:
        async with sim_router(trace_path=str(trace)) as (_, session, _):
            await post(
                session, "/v1/chat/completions", chat(), headers={"X-Fairserve-Client": client}
            )

    run(one_run("first"))
    run(one_run("second"))
    run(one_run("third"))
    clients = {
        path.name: [json.loads(line).get("client") for line in path.read_text().splitlines()]
        for path in sorted(tmp_path.iterdir())
    }
    assert clients == {
        "trace.jsonl": [None, "third"],
        "trace.jsonl.1": [None, "first"],
        "trace.jsonl.2": [None, "second"],
    }
