"""The extension's side-port server over real HTTP: the simulated worker's JSON shapes."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from fairserve.profiling.client import EngineCounters as ProfilingCounters
from fairserve.sglang import hooks
from fairserve.sglang.extension import ExtensionServer
from fairserve.sglang.host import PolicyHost
from fairserve.tui.parse import parse_worker_state
from tests.fakes.sglang import FakeScheduler, Req
from tests.sglang.conftest import MakeHost, make_host

TOKEN = "s3cret"


def call(url: str, method: str = "GET", body: Any = None, token: str | None = None
         ) -> tuple[int, Any]:  # fmt: skip
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class SchedulerLoop:
    """The leader scheduler's iterations: poll (send controls), then process inputs."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        while not self.stop.wait(0.01):
            outgoing = hooks.leader_poll([], object()) or []
            hooks.apply_controls(object(), outgoing)


@pytest.fixture
def served(install: MakeHost) -> Iterator[tuple[PolicyHost, str]]:
    host = install("dlpm", quantum=100)
    server = ExtensionServer(host, "127.0.0.1", 0, admin_token=TOKEN, apply_timeout_s=5)
    server.start()
    loop = SchedulerLoop()
    loop.thread.start()
    try:
        yield host, server.url
    finally:
        loop.stop.set()
        loop.thread.join()
        server.stop()


def test_state_has_the_simulated_workers_shape(served: tuple[PolicyHost, str]) -> None:
    _, url = served
    sched = FakeScheduler(kv_tokens=1000)
    sched.add_request(Req("r0", list(range(40)), 4, "alice"))
    sched.prefill()
    sched.add_request(Req("r1", list(range(20)), 4, "bob"))  # its prompt is cached now
    sched.prefill()
    sched.forward({"r0": 1, "r1": 3})
    status, state = call(url + "/fairserve/worker/state")
    assert status == 200
    assert {"policy", "engine", "waiting", "running", "clients", "kv", "evictions_next"} <= set(
        state
    )
    assert state["policy"]["policy"] == "dlpm" and state["policy"]["quantum"] == 100
    assert set(state["policy"]["clients"]) == {"alice", "bob"}
    assert state["clients"] == {"bob": {"waiting": 0, "running": 1}}
    assert state["engine"]["finished"] == 1 and state["engine"]["decode_tokens"] == 2
    assert state["engine"]["prompt_tokens"] == 60 and state["engine"]["cached_tokens"] == 20
    assert state["engine"]["steps"] == 1 and state["engine"]["busy_s"] > 0
    # what the readers of the simulated worker's state take from it
    counters = ProfilingCounters.from_state(state)
    assert counters is not None and counters.steps == 1 and counters.running == 1
    probe = parse_worker_state(state)
    assert probe.per_client and probe.running == 1 and probe.quantum == 100


def test_quantum_get_and_put(served: tuple[PolicyHost, str]) -> None:
    host, url = served
    assert call(url + "/fairserve/worker/quantum") == (200, {"policy": "dlpm", "quantum": 100})
    status, body = call(url + "/fairserve/worker/quantum", "PUT", {"quantum": 300})
    assert status == 401 and body["error"]["type"] == "authentication_error"
    status, body = call(url + "/fairserve/worker/quantum", "PUT", {"quantum": 300}, TOKEN)
    assert (status, body) == (200, {"policy": "dlpm", "quantum": 300})
    assert host.policy.quantum == 300
    cases = (({"quantum": -1}, "quantum"), ({"quantum": "big"}, "quantum"), ([1], "JSON object"))
    for bad, words in cases:
        status, body = call(url + "/fairserve/worker/quantum", "PUT", bad, TOKEN)
        assert status == 400 and words in body["error"]["message"]
    assert host.policy.quantum == 300


def test_evictions_feed(served: tuple[PolicyHost, str]) -> None:
    host, url = served
    for tokens in ([1, 2], [3], []):
        host.evictions.append(tokens)
    assert call(url + "/fairserve/worker/evictions?since=1&limit=1")[0] == 401  # others' prompts
    status, page = call(url + "/fairserve/worker/evictions?since=1&limit=1", token=TOKEN)
    assert status == 200
    assert page == {"next": 2, "events": [{"seq": 1, "tokens": [3]}], "dropped": False}
    status, body = call(url + "/fairserve/worker/evictions?since=x", token=TOKEN)
    assert status == 400 and "since" in body["error"]["message"]


def test_unknown_paths_and_methods(served: tuple[PolicyHost, str]) -> None:
    _, url = served
    assert call(url + "/nope")[0] == 404
    assert call(url + "/fairserve/worker/state", "PUT", {})[0] == 405


def test_a_put_the_scheduler_never_applies_times_out(install: MakeHost) -> None:
    host = install("dlpm", quantum=100)
    server = ExtensionServer(host, "127.0.0.1", 0, apply_timeout_s=0.2)
    server.start()
    try:
        status, body = call(server.url + "/fairserve/worker/quantum", "PUT", {"quantum": 5})
    finally:
        server.stop()
    assert status == 503 and "next iteration" in body["error"]["message"]
    assert host.policy.quantum == 100  # not applied yet: applies with the next iteration
    hooks.apply_controls(object(), hooks.leader_poll([], object()) or [])
    assert host.policy.quantum == 5


def test_weights_get_and_put_reach_the_policy(served: tuple[PolicyHost, str]) -> None:
    host, url = served
    path, change = url + "/fairserve/worker/weights", {"client": "a", "weight": 2}
    assert call(path) == (200, {"policy": "dlpm", "weights": {}})
    status, body = call(path, "PUT", change)
    assert status == 401 and body["error"]["type"] == "authentication_error"
    status, body = call(path, "PUT", change, "wrong")
    assert status == 403 and body["error"]["type"] == "permission_error"
    status, body = call(path, "PUT", change, TOKEN)
    assert (status, body) == (200, {"policy": "dlpm", "weights": {"a": 2.0}})
    assert host.policy.weight("a") == 2.0


def test_a_weight_change_reaches_every_rank_in_the_same_iteration(install: MakeHost) -> None:
    """Like the quantum: the leader sends it with its aborts, every rank applies it."""
    leader = install("dlpm", quantum=100)
    follower = make_host("dlpm", quantum=100)
    message, applied = leader.controls.submit_weight("a", 4.0)
    sent = hooks.leader_poll([], object())
    assert sent == [message]
    hooks.apply_controls("scheduler", sent)
    assert leader.policy.weight("a") == 4.0 and applied.is_set()
    hooks.install_host(follower)
    hooks.apply_controls("scheduler", sent)
    assert follower.policy.weight("a") == 4.0


def test_a_weight_put_the_scheduler_never_applies_times_out(install: MakeHost) -> None:
    host = install("dlpm", quantum=100)
    server = ExtensionServer(host, "127.0.0.1", 0, apply_timeout_s=0.2)
    server.start()
    try:
        change = {"client": "a", "weight": 3}
        status, body = call(server.url + "/fairserve/worker/weights", "PUT", change)
    finally:
        server.stop()
    assert status == 503 and "weight 3 of client 'a'" in body["error"]["message"]
    assert host.policy.weight("a") == 1.0  # not applied yet: applies with the next iteration
    hooks.apply_controls(object(), hooks.leader_poll([], object()) or [])
    assert host.policy.weight("a") == 3.0
