"""``POLICY/DISPATCH,...`` parsing, the runs a comparison builds, and its rows."""

from __future__ import annotations

import re

import pytest

from fairserve.core.errors import ConfigError
from fairserve.sim.compare import Bench, RunSpec, best_indices, comparison_row, parse_runs
from fairserve.sim.profile import DEFAULT_PROFILE, resolve_profile
from fairserve.workloads import resolve_workload


def test_pairs_and_bare_policies_take_the_default_dispatcher() -> None:
    runs = parse_runs(" lpm/round-robin, vtc/client-rr ,dlpm", default_dispatch="doubleq")
    assert runs == [
        RunSpec("lpm", "round-robin"),
        RunSpec("vtc", "client-rr"),
        RunSpec("dlpm", "doubleq"),
    ]
    assert [r.label for r in runs] == ["lpm/round-robin", "vtc/client-rr", "dlpm/doubleq"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lpm,", r"item 2 '': expected POLICY or POLICY/DISPATCH"),
        ("lpm/", r"item 1 'lpm/': expected"),
        ("/doubleq", r"item 1 '/doubleq': expected"),
        ("lpm/doubleq/x", r"item 1 'lpm/doubleq/x': expected"),
        ("lpm,nope/doubleq", r"item 2 'nope/doubleq': unknown policy 'nope'; expected one of: "),
        ("dlpm/nope", r"item 1 'dlpm/nope': unknown dispatcher 'nope'; expected one of: "),
        ("dlpm,dlpm/doubleq", r"item 2 'dlpm/doubleq': dlpm/doubleq is listed twice"),
    ],
)
def test_bad_items_are_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_runs(text, default_dispatch="doubleq")


def test_unknown_names_list_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"dlpm.*justitia|justitia.*dlpm"):
        parse_runs("nope", default_dispatch="doubleq")


def test_row_reads_the_report_keys() -> None:
    report = {
        "throughput": {"tokens_per_s": 100.0, "service_per_s": 150.0, "requests_per_s": 2.0},
        "cache_hit_rate": 0.5,
        "jain_index": 0.9,
        "max_service_gap": 42.0,
        "clients": {"a": {"latency_p99_s": 1.5}, "b": {"latency_p99_s": None}},
    }
    row = comparison_row("dlpm/doubleq", report)
    assert (row.tokens_per_s, row.service_per_s, row.requests_per_s) == (100.0, 150.0, 2.0)
    assert (row.cache_hit_rate, row.jain_index, row.max_service_gap) == (0.5, 0.9, 42.0)
    assert row.latency_p99_s == {"a": 1.5, "b": None}


def test_best_marks_every_tie_and_nothing_for_no_runs() -> None:
    assert best_indices([1.0, 3.0, 2.0]) == {1}
    assert best_indices([3.0, 1.0, 3.0]) == {0, 2}
    assert best_indices([]) == set()


def bench() -> Bench:
    return Bench(resolve_workload("judge"), resolve_profile(DEFAULT_PROFILE), workers=3, seed=5)


def test_bench_configs_share_everything_but_the_pair() -> None:
    specs = parse_runs("lpm/round-robin,dlpm/doubleq", default_dispatch="doubleq")
    configs = bench().configs(specs)
    assert [(c.policy, c.dispatch) for c in configs] == [
        ("lpm", "round-robin"),
        ("dlpm", "doubleq"),
    ]
    assert {(c.workers, c.seed, c.engine, c.duration_s) for c in configs} == {
        (3, 5, configs[0].engine, None)
    }


def test_a_quantum_goes_only_to_the_runs_that_take_one() -> None:
    specs = parse_runs("lpm/round-robin,dlpm/doubleq", default_dispatch="doubleq")
    configs = bench().configs(specs, quantum=64.0, worker_quantum=128.0)
    assert [(c.quantum, c.worker_quantum) for c in configs] == [(None, None), (64.0, 128.0)]


@pytest.mark.parametrize(
    ("runs", "quanta", "message"),
    [
        ("lpm", {"quantum": 8.0}, "quantum=8: policy lpm has no quantum; policies with one: dlpm"),
        ("lpm,vtc", {"quantum": 8.0}, "policies lpm, vtc have no quantum"),
        ("dlpm/client-rr", {"worker_quantum": 8.0}, "dispatchers with one: doubleq"),
        ("dlpm", {"quantum": -1.0}, "parameter 'quantum' must be > 0"),
    ],
)
def test_quanta_nobody_takes_or_out_of_range_are_refused(
    runs: str, quanta: dict[str, float], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        bench().configs(parse_runs(runs, default_dispatch="doubleq"), **quanta)


def test_default_seed_is_the_workloads() -> None:
    workload = resolve_workload("judge")
    assert Bench(workload, resolve_profile(DEFAULT_PROFILE)).seed_used == workload.seed
