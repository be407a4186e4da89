"""One contract for the worker extension, run against both of its hosts over real HTTP.

* ``sim``: the simulated worker (``WorkerServer``, aiohttp), served on 127.0.0.1 from its own
  event loop in a thread;
* ``sglang``: the SGLang plugin's side-port ``ExtensionServer`` over a real ``PolicyHost``
  (fed by SGLang-shaped fakes: SGLang is not installed here), with a thread standing in for
  the leader scheduler's iterations, which carry quantum and weight changes to the policy.

Same routes, same JSON shapes, same validation messages and the same admin answers (no
token 401, wrong token 403, right token 200); the last test replays one script of requests
against both and requires identical transcripts.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from fairserve.api import paths
from fairserve.api.worker_extension import MAX_BODY_BYTES, ROUTES
from fairserve.sched.local.base import LocalPolicy
from fairserve.worker.server import WorkerServer
from tests.api.servers import sglang_extension
from tests.worker.helpers import make_config

TOKEN = "s3cret"
QUANTUM = 100.0
IMPLEMENTATIONS = ("sim", "sglang")


@dataclass
class Served:
    """One running extension: its base URL and the policy it drives."""

    url: str
    policy: Callable[[], LocalPolicy]


def call(
    url: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


AUTH = bearer(TOKEN)


@contextmanager
def sim_worker(token: str | None) -> Iterator[Served]:
    """A real simulated worker on 127.0.0.1, its event loop in a thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="sim-worker", daemon=True)
    thread.start()
    server = WorkerServer(make_config(admin_token=token, quantum=QUANTUM), "127.0.0.1", 0)
    try:
        url = asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=10)

        def policy() -> LocalPolicy:
            assert server.runtime is not None
            return server.runtime.engine.policy

        yield Served(url, policy)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@contextmanager
def plugin_extension(token: str | None) -> Iterator[Served]:
    with sglang_extension(token, QUANTUM) as (url, host):
        yield Served(url, lambda: host.policy)


def serve(kind: str, token: str | None = TOKEN) -> Any:
    return sim_worker(token) if kind == "sim" else plugin_extension(token)


@pytest.fixture(params=IMPLEMENTATIONS)
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    with serve(str(request.param)) as running:
        yield running


# ------------------------------------------------------------------ routes and shapes
def test_reads_have_the_shared_shapes(served: Served) -> None:
    status, state = call(served.url + paths.WORKER_STATE)
    assert status == 200
    shared = {"model_name", "policy", "engine", "waiting", "running", "clients", "kv"}
    assert shared | {"evictions_next"} <= set(state)
    assert state["policy"]["policy"] == "dlpm" and state["policy"]["quantum"] == QUANTUM
    assert call(served.url + paths.WORKER_QUANTUM) == (200, {"policy": "dlpm", "quantum": 100})
    assert call(served.url + paths.WORKER_WEIGHTS) == (200, {"policy": "dlpm", "weights": {}})
    empty = {"next": 0, "events": [], "dropped": False}
    feed = served.url + paths.WORKER_EVICTIONS + "?since=0&limit=5"
    assert call(feed, headers=bearer(TOKEN)) == (200, empty)


def test_every_route_of_the_table_is_served(served: Served) -> None:
    """A route added to the table reaches both hosts (none routes by hand)."""
    for method, path in ROUTES:
        body: dict[str, Any] | None = None if method == "GET" else {}
        status, _ = call(served.url + path, method, body, bearer(TOKEN))
        assert status in (200, 400), (method, path, status)  # {} is a bad write body


def test_unknown_paths_and_methods_answer_in_the_error_shape(served: Served) -> None:
    for path in ("/fairserve/worker/nope", paths.WORKER_STATE + "/"):
        status, body = call(served.url + path)
        assert status == 404 and body["error"]["code"] == 404, path
    for method, path in (("PUT", paths.WORKER_STATE), ("DELETE", paths.WORKER_QUANTUM)):
        status, body = call(served.url + path, method, {}, bearer(TOKEN))
        assert status == 405 and body["error"]["code"] == 405, (method, path)


# ------------------------------------------------------------------ the admin rule
@pytest.mark.parametrize(
    ("path", "change"),
    [(paths.WORKER_QUANTUM, {"quantum": 64}), (paths.WORKER_WEIGHTS, {"client": "a", "weight": 2})],
)
def test_writes_need_the_admin_token(served: Served, path: str, change: dict[str, Any]) -> None:
    before = call(served.url + path)
    answers = [
        (call(served.url + path, "PUT", change, headers), headers)
        for headers in ({}, {"Authorization": TOKEN}, bearer("wrong"))
    ]
    statuses = [(status, body["error"]["type"]) for (status, body), _ in answers]
    assert statuses == [
        (401, "authentication_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
    ]
    assert call(served.url + path) == before  # nothing changed
    status, after = call(served.url + path, "PUT", change, bearer(TOKEN))
    assert status == 200 and after != before[1]


def test_the_eviction_feed_needs_the_admin_token(served: Served) -> None:
    """The feed carries other tenants' prompts (text blocks or token ids): with a token set,
    only the router (which holds it) may read it."""
    url = served.url + paths.WORKER_EVICTIONS + "?since=0&limit=5"
    assert [call(url, headers=h)[0] for h in ({}, bearer("wrong"))] == [401, 403]
    assert call(url, headers=bearer(TOKEN)) == (200, {"next": 0, "events": [], "dropped": False})


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_without_a_token_a_loopback_listener_accepts_writes(kind: str) -> None:
    with serve(kind, token=None) as running:
        status, body = call(running.url + paths.WORKER_QUANTUM, "PUT", {"quantum": 64})
        assert (status, body) == (200, {"policy": "dlpm", "quantum": 64})
        assert running.policy().quantum == 64


# ------------------------------------------------------------------ weights and quantum
def test_weights_round_trip_to_the_policy(served: Served) -> None:
    url = served.url + paths.WORKER_WEIGHTS
    status, body = call(url, "PUT", {"client": "team-a", "weight": 3}, bearer(TOKEN))
    assert (status, body) == (200, {"policy": "dlpm", "weights": {"team-a": 3.0}})
    assert call(url) == (200, {"policy": "dlpm", "weights": {"team-a": 3.0}})
    assert served.policy().weight("team-a") == 3.0
    status, _ = call(url, "PUT", {"client": "team-b", "weight": 0.5}, bearer(TOKEN))
    assert status == 200 and served.policy().weight("team-b") == 0.5
    assert call(url)[1]["weights"] == {"team-a": 3.0, "team-b": 0.5}


def test_quantum_round_trip_to_the_policy(served: Served) -> None:
    url = served.url + paths.WORKER_QUANTUM
    assert call(url, "PUT", {"quantum": 300}, bearer(TOKEN)) == (
        200,
        {"policy": "dlpm", "quantum": 300},
    )
    assert served.policy().quantum == 300


BAD_WRITES: list[tuple[str, Any, str]] = [
    (paths.WORKER_QUANTUM, {"quantum": "big"}, "quantum: expected a positive number"),
    (paths.WORKER_QUANTUM, {"quantum": -1}, "quantum"),
    (paths.WORKER_QUANTUM, [1], "body: expected a JSON object"),
    (paths.WORKER_WEIGHTS, {"client": "a", "weight": 0}, "weight of client 'a'"),
    (paths.WORKER_WEIGHTS, {"client": "a", "weight": True}, "weight: expected a positive"),
    (paths.WORKER_WEIGHTS, {"client": "", "weight": 1}, "client: expected a non-empty string"),
    (paths.WORKER_WEIGHTS, {"client": "a", "weight": 1, "w": 2}, "w: unknown field"),
    (paths.WORKER_WEIGHTS, {"client": "a", "weight": 10**400}, "weight: expected a positive"),
]


@pytest.mark.parametrize(("path", "bad", "words"), BAD_WRITES)
def test_bad_writes_are_400_and_change_nothing(
    served: Served, path: str, bad: Any, words: str
) -> None:
    before = call(served.url + path)
    status, body = call(served.url + path, "PUT", bad, bearer(TOKEN))
    assert status == 400 and words in body["error"]["message"]
    assert call(served.url + path) == before


def test_an_oversized_body_is_413(served: Served) -> None:
    change = {"client": "a" * MAX_BODY_BYTES, "weight": 2}
    status, body = call(served.url + paths.WORKER_WEIGHTS, "PUT", change, bearer(TOKEN))
    assert status == 413 and "body larger than" in body["error"]["message"]
    assert served.policy().weights == {}


def test_bad_eviction_cursors_are_400(served: Served) -> None:
    for query, words in (("since=-1", "since"), ("since=x", "since"), ("limit=0", "limit")):
        status, body = call(served.url + paths.WORKER_EVICTIONS + "?" + query, "GET", None, AUTH)
        assert status == 400 and words in body["error"]["message"], query


# ------------------------------------------------------------------ one transcript
SCRIPT: list[tuple[str, str, Any, dict[str, str]]] = [
    ("GET", paths.WORKER_QUANTUM, None, {}),
    ("PUT", paths.WORKER_QUANTUM, {"quantum": 64}, {}),
    ("PUT", paths.WORKER_QUANTUM, {"quantum": 64}, bearer("wrong")),
    ("PUT", paths.WORKER_QUANTUM, {"quantum": 64}, bearer(TOKEN)),
    ("PUT", paths.WORKER_QUANTUM, {"quantum": 0}, bearer(TOKEN)),
    ("PUT", paths.WORKER_QUANTUM, {"quantum": None}, bearer(TOKEN)),
    ("GET", paths.WORKER_WEIGHTS, None, {}),
    ("PUT", paths.WORKER_WEIGHTS, {"client": "a", "weight": 4}, {}),
    ("PUT", paths.WORKER_WEIGHTS, {"client": "a", "weight": 4}, bearer(TOKEN)),
    ("PUT", paths.WORKER_WEIGHTS, {"client": "a", "weight": -4}, bearer(TOKEN)),
    ("PUT", paths.WORKER_WEIGHTS, {"weight": 4}, bearer(TOKEN)),
    ("GET", paths.WORKER_WEIGHTS, None, {}),
    ("GET", paths.WORKER_EVICTIONS + "?since=3&limit=2", None, {}),
    ("GET", paths.WORKER_EVICTIONS + "?since=3&limit=2", None, bearer(TOKEN)),
    ("GET", paths.WORKER_EVICTIONS + "?limit=-2", None, bearer(TOKEN)),
]


def test_both_hosts_answer_one_script_identically() -> None:
    transcripts: dict[str, list[tuple[int, Any]]] = {}
    for kind in IMPLEMENTATIONS:
        with serve(kind) as running:
            transcripts[kind] = [
                call(running.url + path, method, body, headers)
                for method, path, body, headers in SCRIPT
            ]
    assert transcripts["sim"] == transcripts["sglang"]
    assert [status for status, _ in transcripts["sim"]] == [
        200, 401, 403, 200, 400, 400, 200, 401, 200, 400, 400, 200, 401, 200, 400,
    ]  # fmt: skip
