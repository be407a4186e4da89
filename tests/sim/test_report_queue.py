"""The report's ``queue`` figure counts requests parked in the running set (issue 17).

vLLM-v0 runs a prefill-only step whenever a waiting request can be admitted: at 0.9 of
capacity with memory no constraint, its admitted requests hold KV while the prefill steps
keep them from decoding, and the requests in the system grow without bound while the
waiting queue stays near empty. A queue figure that counts only the waiting queue reported
3 queued requests with 2,061 in the system; it must count the parked ones too. Sarathi
decodes every running request in every step: nothing is parked, and its queue figure stays
the small waiting queue although hundreds of requests run.
"""

from __future__ import annotations

from typing import Any

from fairserve.sim.cluster import SimConfig, simulate
from fairserve.sim.engine import EngineConfig
from fairserve.sim.profile import DEFAULT_PROFILE, resolve_profile
from fairserve.sim.report import build_report
from tests.fakes.workloads import ClientSpec, SpecWorkload

PROFILE = resolve_profile(DEFAULT_PROFILE)
UNBOUNDED_KV_TOKENS = 50_000_000
"""A KV pool no run here fills (the throughput-optimal paper's Fig. 1: memory is not a
constraint)."""


def _run(batching: str) -> dict[str, Any]:
    rate_per_s = 0.9 * PROFILE.capacity_tokens_per_s / 600
    workload = SpecWorkload((ClientSpec("a", rate_per_s, 500, 100),), duration_s=90)
    engine = EngineConfig(
        kv_capacity_tokens=UNBOUNDED_KV_TOKENS,
        max_batch_tokens=PROFILE.max_batch_tokens,
        batching=batching,
    )
    config = SimConfig(engine=engine, time_model=PROFILE.batch_time(), policy="fcfs", workers=1)
    return build_report(simulate(workload, config))


def test_vllm_v0_queue_counts_requests_parked_in_the_running_set() -> None:
    report = _run("vllm-v0")
    in_system = report["conservation"]["unfinished"]
    queue = report["queue"]
    assert in_system > 300  # the system does not keep up (the paper's Fig. 1)
    assert queue["end"] >= 0.5 * in_system
    assert queue["second_half_mean"] > 2 * queue["first_half_mean"]


def test_sarathi_queue_is_the_waiting_queue_when_every_running_request_progresses() -> None:
    report = _run("sarathi")
    assert report["conservation"]["unfinished"] > 100  # requests run: none is parked
    assert report["queue"]["max"] < 50
    assert report["queue"]["second_half_mean"] <= report["queue"]["first_half_mean"] + 10
