"""Built-in workloads: all load, all generate, and names resolve like the CLI expects."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from fairserve.core.errors import UnknownNameError
from fairserve.workloads import (
    TraceWorkload,
    builtin_names,
    builtin_text,
    list_builtin,
    load_builtin,
    resolve_workload,
)
from fairserve.workloads.stats import describe, summarize

from .test_programs import check_program

EXPECTED = {
    "vtc-constant", "vtc-on-off", "vtc-poisson-short-long", "vtc-ramp", "vtc-shift",
    "long-qa-s1", "long-qa-s2", "tot-s1", "tot-s2", "judge", "multi-turn-chat",
}  # fmt: skip


def test_the_papers_scenarios_are_built_in() -> None:
    assert set(builtin_names()) >= EXPECTED
    listed = list_builtin()
    assert [name for name, _ in listed] == builtin_names()
    assert all(description for _, description in listed)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_loads_and_generates(name: str) -> None:
    w = load_builtin(name)
    assert w.name == name
    assert 60 <= w.duration_s <= 600
    assert len(w.clients) >= 2
    programs = list(itertools.islice(w.programs(), 200))
    assert {p.client for p in programs} <= {c.name for c in w.clients}
    for p in programs:
        check_program(p)
        assert p.start_s < w.duration_s


@pytest.mark.parametrize("name", ["tot-s1", "multi-turn-chat"])
def test_an_hour_of_a_builtin_is_generated_lazily(name: str) -> None:
    programs = list(itertools.islice(load_builtin(name).programs(duration_s=3600.0), 20))
    assert len(programs) == 20


def test_misbehaving_clients_are_heavier() -> None:
    """S1: more calls per program; S2: longer prompts (same rate, same shape)."""
    s1 = summarize(load_builtin("tot-s1"), duration_s=120.0).clients
    assert s1["bad"].calls > 5 * s1["good1"].calls
    s2 = summarize(load_builtin("tot-s2"), duration_s=120.0).clients
    bad, good = s2["bad"], s2["good1"]
    assert bad.prompt_tokens / bad.calls > 1.5 * good.prompt_tokens / good.calls
    qa = summarize(load_builtin("long-qa-s2"), duration_s=120.0).clients
    assert qa["bad"].prompt_tokens > 1.5 * qa["good2"].prompt_tokens


def test_resolve_by_name_and_by_path(tmp_path: Path) -> None:
    assert resolve_workload("judge").name == "judge"
    path = tmp_path / "custom.toml"
    path.write_text(builtin_text("vtc-ramp").replace('name = "vtc-ramp"', 'name = "mine"'))
    assert resolve_workload(path).name == "mine"
    assert resolve_workload(str(path)).name == "mine"
    plain = tmp_path / "plainfile"
    plain.write_text(builtin_text("vtc-constant"))
    assert resolve_workload(str(plain)).name == "vtc-constant"
    trace = tmp_path / "recorded.jsonl"
    trace.write_text('{"client": "c", "arrival_s": 0.5, "prompt_tokens": 3, "output_tokens": 1}')
    replay = resolve_workload(trace)
    assert isinstance(replay, TraceWorkload) and replay.name == "recorded"


def test_unknown_name_lists_the_builtins() -> None:
    with pytest.raises(
        UnknownNameError, match=r"unknown workload 'nope'; expected one of: .*judge"
    ):
        resolve_workload("nope")


def test_summary_totals_and_ideal_cache() -> None:
    w = load_builtin("judge")
    plain = summarize(w, duration_s=30.0)
    cached = summarize(w, duration_s=30.0, ideal_cache=True)
    total, total_cached = plain.total(), cached.total()
    assert total.extend_tokens == total.prompt_tokens
    assert total_cached.prompt_tokens == total.prompt_tokens
    assert 0 < total_cached.extend_tokens < total.prompt_tokens / 2
    assert total.programs == sum(c.programs for c in plain.clients.values())
    assert total_cached.service() == total_cached.extend_tokens + 2 * total_cached.output_tokens
    lines = describe(cached)
    assert lines[-1].startswith("total: ") and len(lines) == len(w.clients) + 1
