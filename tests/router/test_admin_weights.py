"""The router's admin API for tuning: the effective quantum, live quanta reaching every
worker's next batching decision, and live client weights."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from fairserve.worker.server import WorkerServer
from tests.router.helpers import bind_runner, get_json, routed, sim_router
from tests.worker.helpers import run

TOKEN = "s3cret"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


async def put(
    session: aiohttp.ClientSession, path: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with session.put(path, json=body, headers=headers or {}) as resp:
        return resp.status, await resp.json(content_type=None)


# ---------------------------------------------------------------------- quantum
def test_quantum_shows_the_workers_value_before_anyone_sets_one() -> None:
    async def body() -> None:
        async with sim_router(worker={"quantum": 300.0}) as (_, session, workers):
            status, view = await get_json(session, "/fairserve/v1/quantum")
            assert status == 200
            assert (view["quantum"], view["quantum_source"]) == (300.0, "workers")
            assert view["worker_quanta"] == {w.url: 300.0 for w in workers}
            _, state = await get_json(session, "/fairserve/v1/state")
            assert state["quantum"]["quantum"] == 300.0

    run(body())


def test_quantum_falls_back_to_the_policy_default_without_workers() -> None:
    async def body() -> None:
        async with routed(["http://127.0.0.1:9"]) as (_, session):  # nothing listens there
            _, view = await get_json(session, "/fairserve/v1/quantum")
            assert (view["quantum"], view["quantum_source"]) == (512.0, "default")
            assert view["worker_quanta"] == {}
        async with routed(["http://127.0.0.1:9"], policy="vtc", quantum=None) as (_, session):
            _, view = await get_json(session, "/fairserve/v1/quantum")
            assert (view["quantum"], view["quantum_source"]) == (None, None)

    run(body())


async def _one_request(worker: WorkerServer, client: str) -> dict[str, Any]:
    """A fresh client's request straight to ``worker``: its usage."""
    body = {
        "input_ids": list(range(100, 140)),
        "sampling_params": {"max_new_tokens": 3},
        "routing_key": client,
    }
    async with aiohttp.ClientSession() as session:
        async with session.post(worker.url + "/generate", json=body) as resp:
            assert resp.status == 200
            meta: dict[str, Any] = (await resp.json())["meta_info"]
        async with session.get(worker.url + "/fairserve/worker/state") as resp:
            state = await resp.json()
    return {"meta": meta, "deficit": state["policy"]["clients"][client]["deficit"]}


def test_a_new_quantum_is_used_at_the_next_batching_decision_of_every_worker() -> None:
    """A client new to a worker starts at deficit 0, so its first admission refills it by
    exactly one quantum: deficit after the request = Q^u − cost. With the default 512 that
    would be 512 − cost; after the PUT it must be 777 − cost on every worker."""

    async def body() -> None:
        worker = {"admin_token": TOKEN}
        async with sim_router(worker=worker, admin_token=TOKEN) as (_, session, workers):
            status, view = await put(session, "/fairserve/v1/quantum", {"quantum": 777}, ADMIN)
            assert status == 200 and view["worker_errors"] == []
            assert view["quantum_source"] == "set"
            assert view["worker_quanta"] == {w.url: 777.0 for w in workers}
            for index, server in enumerate(workers):
                async with (
                    aiohttp.ClientSession() as direct,
                    direct.get(server.url + "/fairserve/worker/quantum") as resp,
                ):
                    assert (await resp.json())["quantum"] == 777.0
                seen = await _one_request(server, f"fresh{index}")
                meta = seen["meta"]
                cost = meta["prompt_tokens"] - meta["cached_tokens"] + 2 * meta["completion_tokens"]
                assert seen["deficit"] == 777.0 - cost

    run(body())


# ---------------------------------------------------------------------- weights
def test_weight_writes_need_the_admin_token_and_valid_values() -> None:
    async def body() -> None:
        async with sim_router(admin_token=TOKEN) as (_, session, _):
            ok = {"client": "alice", "weight": 2}
            assert (await put(session, "/fairserve/v1/weights", ok))[0] == 401
            wrong = {"Authorization": "Bearer nope"}
            assert (await put(session, "/fairserve/v1/weights", ok, wrong))[0] == 403
            for bad, field in [
                ({"client": "alice", "weight": 0}, "weight"),
                ({"client": "alice", "weight": -1.5}, "weight"),
                ({"client": "alice", "weight": "heavy"}, "weight"),
                ({"client": "alice", "weight": True}, "weight"),
                ({"client": "", "weight": 1}, "client"),
                ({"weight": 1}, "client"),
                # names no request can carry (X-Fairserve-Client and 'user' refuse them)
                ({"client": "bad name", "weight": 2}, "client"),
                ({"client": "x" * 200, "weight": 2}, "client"),
                ({"client": "caf\u00e9", "weight": 2}, "client"),
                ({"client": "alice", "weight": 1, "extra": 1}, "extra"),
            ]:
                status, answer = await put(session, "/fairserve/v1/weights", bad, ADMIN)
                assert status == 400, bad
                assert answer["error"]["message"].startswith(field), answer
        keyed = {"Team A": 1.0}  # a clients file names its clients freely
        async with sim_router(admin_token=TOKEN, weights=keyed) as (_, session, _):
            status, _ = await put(
                session, "/fairserve/v1/weights", {"client": "Team A", "weight": 2}, ADMIN
            )
            assert status == 200
        async with sim_router() as (_, session, _):  # no admin token configured
            status, answer = await put(session, "/fairserve/v1/weights", ok, ADMIN)
            assert status == 403 and "--admin-token" in answer["error"]["message"]

    run(body())


def test_a_weight_reaches_dispatcher_queues_and_accounting() -> None:
    async def body() -> None:
        config: dict[str, Any] = {
            "admin_token": TOKEN,
            "router_queue": "on",
            "weights": {"bob": 3.0},
        }
        async with sim_router(**config) as (server, session, workers):
            headers = {"X-Fairserve-Client": "alice"}
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            async with session.post("/v1/chat/completions", json=chat, headers=headers) as resp:
                assert resp.status == 200
            status, answer = await put(
                session, "/fairserve/v1/weights", {"client": "alice", "weight": 4}, ADMIN
            )
            assert status == 200, answer
            assert (answer["previous"], answer["weight"]) == (1.0, 4.0)
            assert answer["router_queues"] == len(workers)
            assert set(answer["workers"]) == {w.url for w in workers}
            assert set(answer["workers"].values()) <= {"ok", "unsupported"}
            router = server.router
            assert router.dispatcher.weight("alice") == 4.0
            assert all(
                up.queue is not None and up.queue.policy.weight("alice") == 4.0
                for up in router.upstreams.values()
            )
            _, state = await get_json(session, "/fairserve/v1/state")
            assert state["clients"]["alice"]["weight"] == 4.0
            _, weights = await get_json(session, "/fairserve/v1/weights")
            assert weights == {"weights": {"alice": 4.0, "bob": 3.0}, "changed": {"alice": 4.0}}
            # A client the router has never seen is not invented (it would count in Jain).
            await put(session, "/fairserve/v1/weights", {"client": "carol", "weight": 2}, ADMIN)
            _, state = await get_json(session, "/fairserve/v1/state")
            assert "carol" not in state["clients"]

    run(body())


class ExtensionWorker:
    """A worker with the fairserve extension that records weight pushes (a real simulated
    worker has no weights endpoint yet)."""

    def __init__(self, weights_status: int = 200) -> None:
        self.pushes: list[tuple[dict[str, Any], str | None]] = []
        self.weights_status = weights_status

    def app(self) -> web.Application:
        app = web.Application()

        async def ok(_: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "m"}]})

        async def quantum(_: web.Request) -> web.Response:
            return web.json_response({"policy": "dlpm", "quantum": 512.0})

        async def evictions(_: web.Request) -> web.Response:
            return web.json_response({"events": [], "next": 0})

        async def weights(request: web.Request) -> web.Response:
            self.pushes.append((await request.json(), request.headers.get("Authorization")))
            return web.json_response({}, status=self.weights_status)

        app.add_routes(
            [
                web.get("/health", ok),
                web.get("/get_server_info", ok),
                web.get("/v1/models", models),
                web.get("/fairserve/worker/state", ok),
                web.get("/fairserve/worker/quantum", quantum),
                web.get("/fairserve/worker/evictions", evictions),
                web.put("/fairserve/worker/weights", weights),
            ]
        )
        return app


def test_weights_are_pushed_to_workers_that_take_them() -> None:
    async def body() -> None:
        taker, refuser = ExtensionWorker(), ExtensionWorker(weights_status=404)
        runners = [await bind_runner(w.app()) for w in (taker, refuser)]
        urls = [url for _, url in runners]
        try:
            async with routed(urls, admin_token=TOKEN) as (_, session):
                change = {"client": "alice", "weight": 0.5}
                status, answer = await put(session, "/fairserve/v1/weights", change, ADMIN)
            assert status == 200, answer
            assert answer["workers"] == {urls[0]: "ok", urls[1]: "unsupported"}
            assert taker.pushes == [({"client": "alice", "weight": 0.5}, f"Bearer {TOKEN}")]
        finally:
            for runner, _ in runners:
                await runner.cleanup()

    run(body())
