"""Program streams: seeded, ordered, windowed, lazy, and independent between clients."""

from __future__ import annotations

import itertools

import pytest

from fairserve.core.errors import ConfigError
from fairserve.workloads import Program, Workload

from .helpers import client, take, workload

MIXED = (
    client("chat", program="multi-turn", turns=3, shared_prefix_tokens=30),
    client("tot", program="tree-of-thought", branches=2, depth=2, arrival="gamma", cv=2),
    client("qa", program="long-qa", shared_prefix_tokens=300, documents=2, arrival="uniform"),
    client("judge", program="judge", dimensions=2, rate_per_s=1.0),
)


def of(programs: list[Program], name: str) -> list[Program]:
    return [p for p in programs if p.client == name]


def test_same_seed_same_stream_different_seed_different_stream() -> None:
    w = workload(*MIXED)
    first, again = list(w.programs()), list(w.programs())
    assert first == again and len(first) > 100
    assert list(workload(*MIXED).programs()) == first
    other = list(w.programs(seed=8))
    assert other != first
    assert [c.prompt_key for c in other[0].calls] != [c.prompt_key for c in first[0].calls]
    assert list(w.programs(seed=8)) == list(workload(*MIXED, seed=8).programs())


def test_adding_or_moving_a_client_leaves_the_others_unchanged() -> None:
    base = list(workload(*MIXED).programs())
    extra = list(workload(client("newcomer"), *reversed(MIXED)).programs())
    for name in ("chat", "tot", "qa", "judge"):
        assert of(extra, name) == of(base, name)


def test_starts_sorted_and_before_the_duration() -> None:
    programs = list(workload(*MIXED).programs())
    starts = [p.start_s for p in programs]
    assert starts == sorted(starts)
    assert starts[0] >= 0 and starts[-1] < 60.0
    apps = [p.app for p in programs]
    assert len(set(apps)) == len(apps)
    ids = [c.id for p in programs for c in p.calls]
    assert len(set(ids)) == len(ids)


def test_duration_override_is_a_prefix_of_the_longer_stream() -> None:
    w = workload(*MIXED)
    short = list(w.programs(duration_s=20.0))
    assert short == [p for p in w.programs() if p.start_s < 20.0]
    longer = list(w.programs(duration_s=120.0))
    assert longer[: len(list(w.programs()))] == list(w.programs())
    assert longer[-1].start_s > 100.0


def test_windows_bound_each_stream() -> None:
    w = workload(client("a", start_s=10, stop_s=20, rate_per_s=5), client("b", start_s=50))
    programs = list(w.programs())
    assert all(10 <= p.start_s < 20 for p in of(programs, "a"))
    assert all(50 <= p.start_s < 60 for p in of(programs, "b"))
    assert len(of(programs, "a")) > 20


def test_phases_of_one_client_share_numbering_and_prefix() -> None:
    w = workload(
        client("a", stop_s=30, rate_per_s=4, shared_prefix_tokens=20),
        client("a", start_s=30, arrival="uniform", rate_per_s=1, shared_prefix_tokens=20),
    )
    programs = list(w.programs())
    assert [p.app for p in programs] == [f"a/p{n}" for n in range(len(programs))]
    late = [p for p in programs if p.start_s >= 30]
    assert [p.start_s for p in late] == [30.0 + k for k in range(30)]
    assert len({p.calls[0].prompt_key[:80] for p in programs}) == 1


def test_generation_is_lazy() -> None:
    w = workload(*MIXED)
    # A year of traffic: only lazy generation gets the first programs back at all.
    first = list(itertools.islice(w.programs(duration_s=365 * 86400.0), 50))
    assert first == take(w, 50)


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_bad_seed_override(seed: object) -> None:
    with pytest.raises(ConfigError, match="seed: expected an integer >= 0"):
        workload().programs(seed=seed)  # type: ignore[arg-type]


@pytest.mark.parametrize("duration_s", [0.0, -3.0, float("nan")])
def test_bad_duration_override(duration_s: float) -> None:
    with pytest.raises(ConfigError, match="duration_s: expected a positive number"):
        workload().programs(duration_s=duration_s)


def test_workload_protocol_properties() -> None:
    w: Workload = workload(client("a", weight=2), client("b"), description="hello", seed=3)
    assert (w.name, w.description, w.duration_s, w.seed) == ("test", "hello", 60.0, 3)
    assert [(c.name, c.weight) for c in w.clients] == [("a", 2.0), ("b", 1.0)]
