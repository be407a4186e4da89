"""The fleet's one cache model (``sched/dispatch/cache_model.py``): the per-worker match a
fair queue orders by agrees with a brute-force reading of what each worker was sent, the
dispatcher's match agrees with it, and records wait for the release when a queue stands in
front of the worker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.types import tokens_to_key
from fairserve.sched.dispatch.cache_model import CacheModel

WORKERS = ("w0", "w1", "w2")

prompts = st.lists(st.integers(0, 3), min_size=1, max_size=12)
"""Small alphabets: prompts share prefixes of every length."""


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@given(
    sent=st.lists(st.tuples(st.sampled_from(WORKERS), prompts), max_size=30),
    probes=st.lists(prompts, min_size=1, max_size=8),
)
def test_each_workers_match_is_its_longest_prefix_of_what_it_was_sent(
    sent: list[tuple[str, list[int]]], probes: list[list[int]]
) -> None:
    model = CacheModel()
    for worker, tokens in sent:
        model.dispatched(tokens_to_key(tokens), worker)
    for probe in probes:
        key = tokens_to_key(probe)
        expected = {
            w: max((_common(probe, t) for s, t in sent if s == w), default=0) for w in WORKERS
        }
        assert {w: model.match_len(key, w) for w in WORKERS} == expected
        match = model.match(key)
        assert match.tokens == max(expected.values())
        if match.tokens:
            assert match.owners == {w for w in WORKERS if expected[w] == match.tokens}


def test_a_queued_worker_records_at_release_only() -> None:
    model = CacheModel()
    key = tokens_to_key([1, 2, 3, 4])
    model.queue_in_front("w0", True)
    model.dispatched(key, "w0")
    model.dispatched(key, "w1")
    assert model.match_len(key, "w0") == 0  # waiting: it must not match itself
    assert model.match_len(key, "w1") == 4  # no queue in front: recorded at dispatch
    model.released(key, "w0")
    assert model.match_len(key, "w0") == 4
    model.queue_in_front("w0", False)
    model.dispatched(tokens_to_key([9, 9]), "w0")
    assert model.match_len(tokens_to_key([9, 9]), "w0") == 2


def test_evictions_and_forgetting_reach_the_per_worker_match() -> None:
    model = CacheModel()
    model.record(tokens_to_key([1, 2, 3, 4]), "w0")
    model.record(tokens_to_key([1, 2, 5, 6]), "w0")
    model.record(tokens_to_key([1, 2, 3, 4]), "w1")
    model.evicted("w0", tokens_to_key([1, 2, 3, 4]))
    assert model.match_len(tokens_to_key([1, 2, 3, 4]), "w0") == 2
    assert model.match_len(tokens_to_key([1, 2, 3, 4]), "w1") == 4
    model.forget("w1")
    assert model.match_len(tokens_to_key([1, 2, 3, 4]), "w1") == 0
    assert model.match(tokens_to_key([1, 2, 3, 4])).owners == {"w0"}


def test_the_tighter_bound_applies_at_every_record() -> None:
    model = CacheModel(max_tokens_per_worker=100)
    model.bound("w0", 40)  # the host's limit is tighter than the dispatcher's
    for index in range(20):
        model.released(tokens_to_key([index] * 10), "w0")
        assert model.worker_tokens("w0") <= 40
        model.dispatched(tokens_to_key([100 + index] * 10), "w1")
        assert model.worker_tokens("w1") <= 100
    model.bound("w0", 0)  # no host limit: the dispatcher's bound is left
    for index in range(20):
        model.released(tokens_to_key([200 + index] * 10), "w0")
    assert 40 < model.worker_tokens("w0") <= 100


operations = st.lists(
    st.tuples(
        st.sampled_from(["record", "ask", "done", "evict", "forget", "bound"]),
        st.sampled_from(WORKERS),
        prompts,
        st.integers(0, 40),
    ),
    max_size=60,
)


@given(operations)
def test_kept_matches_are_always_what_a_walk_finds(
    ops: list[tuple[str, str, list[int], int]],
) -> None:
    """Asked again between records, evictions, bounds and forgetting, a kept match equals a
    fresh walk of the tree (the kept-match invalidation misses no change)."""
    model = CacheModel()
    asked: set[bytes] = set()
    for op, worker, tokens, size in ops:
        key = tokens_to_key(tokens)
        if op == "record":
            model.record(key, worker)
        elif op == "ask":
            asked.add(key)
        elif op == "done":
            model.done_asking(key, worker)
        elif op == "evict":
            model.evicted(worker, key[: 4 * (size % (len(tokens) + 1))])
        elif op == "forget":
            model.forget(worker)
        else:
            model.bound(worker, size)
        for other in WORKERS:
            for probe in asked | {key}:
                assert model.match_len(probe, other) == model.walk_len(probe, other)
