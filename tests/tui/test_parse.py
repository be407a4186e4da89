"""Parsing router and worker JSON into frozen snapshots: exact where the data is good,
tolerant (defaults, never an exception) where it is missing or malformed."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.tui.model import GpuView, Snapshot
from fairserve.tui.parse import parse_quanta, parse_sglang_metrics, parse_state, parse_worker_state
from tests.tui.fakes import GPUS, WORKERS, state_json, worker_state_json


def test_state_fields_are_read() -> None:
    snapshot = parse_state(state_json(75.0, quantum=256.0))
    assert snapshot.router.url == "http://127.0.0.1:8000"
    assert snapshot.router.uptime_s == 75.0
    assert (snapshot.router.policy, snapshot.router.dispatch) == ("dlpm", "doubleq")
    assert snapshot.quanta.quantum == 256.0
    assert snapshot.quanta.worker_quantum == 2048.0
    assert snapshot.jain_index == 0.94
    assert snapshot.jain_window_s == (12.0, 75.0)
    assert snapshot.throughput.tokens_per_s == 23400.0
    assert [c.name for c in snapshot.clients] == ["alice", "bob", "carol", "dave-batch"]
    alice = snapshot.clients[0]
    assert alice.queued == 1 and alice.in_flight == 2
    assert dict(alice.deficits)[WORKERS[1]] == -300.0
    assert [w.url for w in snapshot.workers] == list(WORKERS)
    down = snapshot.workers[2]
    assert not down.healthy and down.last_error == "connection refused"
    assert down.capacity_tokens_per_s == 12000.0


def test_snapshots_are_immutable() -> None:
    snapshot = parse_state(state_json(1.0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.router = snapshot.router  # type: ignore[misc]
    assert isinstance(snapshot.clients, tuple) and isinstance(snapshot.workers, tuple)


def test_missing_keys_give_defaults() -> None:
    snapshot = parse_state({}, url="http://r:1")
    assert snapshot.router.url == "http://r:1"
    assert snapshot.router.policy == "?"
    assert snapshot.clients == () and snapshot.workers == ()
    assert snapshot.jain_index is None and snapshot.local_quantum is None


def test_json_infinity_and_nulls() -> None:
    quanta = parse_quanta({"quantum": None, "worker_quantum": "inf"})
    assert quanta.quantum is None and quanta.worker_quantum == math.inf
    client = parse_state({"clients": {"x": {"latency_p50_s": None, "weight": "heavy"}}}).clients[0]
    assert client.latency_p50_s is None and client.weight == 1.0


def test_wrong_types_are_ignored() -> None:
    snapshot = parse_state(
        {
            "router": [],
            "clients": {"a": "not a dict", "b": {"requests": True, "deficits": [1, 2]}},
            "workers": [{"url": 7, "healthy": "yes", "prompt_tokens": "many"}, None, 3],
            "jain_window_s": [1.0],
            "quantum": "fast",
        }
    )
    assert [c.name for c in snapshot.clients] == ["a", "b"]
    assert snapshot.clients[1].requests == 0 and snapshot.clients[1].deficits == ()
    assert snapshot.workers[0].url == "?" and not snapshot.workers[0].healthy
    assert snapshot.jain_window_s is None


JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)
KEYS = st.sampled_from(["router", "quantum", "clients", "workers", "jain_index", "throughput"])


@given(st.dictionaries(KEYS, JSON, max_size=6))
def test_parse_never_raises(data: dict[str, Any]) -> None:
    assert isinstance(parse_state(data), Snapshot)
    assert parse_worker_state(data).speed > 0


def test_worker_state() -> None:
    probe = parse_worker_state(worker_state_json(1))
    assert (probe.running, probe.waiting) == (9, 2)
    assert probe.kv_fraction == 0.5
    assert probe.quantum == 512.0
    assert (probe.gpu_index, probe.gpu_uuid) == (1, "GPU-0001")
    assert probe.per_client
    assert {c.name: (c.waiting, c.running) for c in probe.clients}["alice"] == (1, 3)
    assert not parse_worker_state({}).per_client


def test_sglang_metrics_are_summed_over_ranks() -> None:
    text = "\n".join(
        [
            "# HELP sglang:num_running_reqs Running requests.",
            'sglang:num_running_reqs{model_name="m",dp_rank="0"} 3.0',
            'sglang:num_running_reqs{model_name="m",dp_rank="1"} 4.0',
            'sglang:num_queue_reqs{model_name="m"} 5',
            'sglang:token_usage{model_name="m",dp_rank="0"} 0.25',
            'sglang:token_usage{model_name="m",dp_rank="1"} 0.75',
            "sglang:cache_hit_rate NaN",
            "other_metric 9",
        ]
    )
    probe = parse_sglang_metrics(text)
    assert (probe.running, probe.waiting) == (7, 5)
    assert probe.kv_fraction == 0.5
    assert not probe.per_client
    assert parse_sglang_metrics("garbage\n\n") == parse_sglang_metrics("")


def test_probes_and_gpus_are_attached_without_mutation() -> None:
    snapshot = parse_state(state_json(1.0))
    probe = parse_worker_state(worker_state_json(0))
    enriched = snapshot.with_probes({WORKERS[0]: probe}).with_gpus((GpuView.of(GPUS[0]),))
    assert snapshot.workers[0].probe is None and snapshot.gpus == ()
    assert enriched.workers[0].probe == probe and enriched.workers[1].probe is None
    assert enriched.gpus[0].utilization_pct == 87.0
    assert enriched.local_quantum == 512.0  # the router has none set: the worker's


def test_wall_capacity_scales_with_simulated_speed() -> None:
    snapshot = parse_state(state_json(1.0))
    fast = {**worker_state_json(0), "speed": 20.0}
    worker = snapshot.with_probes({WORKERS[0]: parse_worker_state(fast)}).workers[0]
    assert worker.wall_capacity_tokens_per_s == 12000.0 * 20.0
    assert snapshot.workers[0].wall_capacity_tokens_per_s == 12000.0


@pytest.mark.parametrize("judged", [0, 1])
def test_jain_over_fewer_than_two_clients_is_not_shown(judged: int) -> None:
    """The router reports Jain 1.0 when fewer than two clients were active in its window
    (an index over one client says nothing); the dashboard shows n/a, not a perfect 1.00."""
    state = {**state_json(75.0), "jain_index": 1.0, "fairness": {"clients_judged": judged}}
    assert parse_state(state).jain_index is None
    state["fairness"] = {"clients_judged": 2}
    assert parse_state(state).jain_index == 1.0
