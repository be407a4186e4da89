"""Per-program completion times in the simulate report (the ``programs`` key)."""

from __future__ import annotations

import pytest

from fairserve.sim.cluster import SimConfig, simulate
from fairserve.sim.engine import EngineConfig
from fairserve.sim.profile import DEFAULT_PROFILE, resolve_profile
from fairserve.sim.programs import ProgramRecord, programs_report
from fairserve.sim.report import build_report
from fairserve.workloads import loads_workload

CHAT = """
name = "chat"
duration_s = 30
seed = 2

[[clients]]
name = "a"
program = "multi-turn"
turns = 3
think_time_s = 1.0
arrival = "uniform"
rate_per_s = 0.5
input_tokens = 100
output_tokens = 20
"""


def run(drain: bool) -> dict[str, object]:
    profile = resolve_profile(DEFAULT_PROFILE)
    engine = EngineConfig(
        kv_capacity_tokens=profile.kv_capacity_tokens, max_batch_tokens=profile.max_batch_tokens
    )
    config = SimConfig(
        engine=engine, time_model=profile.batch_time(), policy="fcfs", dispatch="round-robin",
        workers=1, drain=drain,
    )  # fmt: skip
    return build_report(simulate(loads_workload(CHAT), config))


def test_a_program_lasts_over_its_calls_and_think_times() -> None:
    report = run(drain=True)
    programs = report["programs"]
    assert isinstance(programs, dict)
    assert programs["finished"] == 15 and programs["unfinished"] == 0  # 0.5/s over 30 s
    # three turns, two think times of 1 s: a program takes more than 2 s, a call far less
    assert programs["completion_p50_s"] > 2.0
    client = report["clients"]["a"]  # type: ignore[index]
    assert client["latency_p99_s"] < 1.0
    assert programs["clients"]["a"]["finished"] == 15
    assert programs["types"]["multi-turn"]["finished"] == 15


def test_programs_cut_by_the_end_of_the_run_are_counted_unfinished() -> None:
    programs = run(drain=False)["programs"]
    assert isinstance(programs, dict)
    assert programs["unfinished"] >= 1
    assert programs["finished"] + programs["unfinished"] == 15


def test_summary_of_no_programs_has_no_numbers() -> None:
    out = programs_report([], {"a": 2})
    assert out["finished"] == 0 and out["unfinished"] == 2
    assert out["completion_p99_s"] is None and out["completion_mean_s"] is None
    one = programs_report([ProgramRecord("a", "a/p0", "single", 1.0, 3.5, 1)], {"a": 0})
    assert one["completion_p50_s"] == pytest.approx(2.5)
