"""Evictions from SGLang's real radix cache reach the plugin's feed with the right token
prefixes, and nothing else does: ``SchedulePolicy`` resets its in-batch tree of the waiting
queue at every LPM ordering, and that tree's recorder reports "all cleared" (issue 19,
defect 1: a spurious flush on almost every batching step)."""

from __future__ import annotations

from tests.sglang_real.real import require_sglang

require_sglang()

from tests.sglang_real.harness import Engine, set_policy  # noqa: E402

SHARED = list(range(500, 560))
"""A 60-token system prompt every request of client ``a`` starts with."""


def tokens(i: int) -> list[int]:
    return SHARED + [10_000 + i * 100 + k for k in range(40)]


def run_contended(engine: Engine, requests: int, steps: int) -> dict[str, list[int]]:
    """Requests arrive two per step into a KV pool that holds about five: the cache must
    evict finished prefixes to admit new ones. Returns every request's tokens."""
    sent: dict[str, list[int]] = {}
    for step in range(steps):
        for i in range(2 * step, min(2 * step + 2, requests)):
            sent[f"r{i}"] = tokens(i)
            engine.add(f"r{i}", sent[f"r{i}"], 6, "a" if i % 3 else "b")
        engine.step()
    return sent


def test_no_flush_is_reported_for_the_waiting_queues_tree() -> None:
    set_policy("vtc")
    engine = Engine(kv_tokens=600)
    run_contended(engine, requests=30, steps=40)
    host = engine.host
    assert host is not None
    assert engine.policy.waiting_queue_radix_tree.kv_events is not None  # it has a recorder
    events = host.evictions.read(0, 10_000)["events"]
    flushes = [e for e in events if e["tokens"] == []]
    assert flushes == [], f"{len(flushes)} of {len(events)} eviction events are flushes"


def test_evictions_are_prefixes_of_what_was_cached() -> None:
    set_policy("dlpm", 200)
    engine = Engine(kv_tokens=600)
    sent = run_contended(engine, requests=30, steps=40)
    host = engine.host
    assert host is not None
    events = host.evictions.read(0, 10_000)["events"]
    assert len(events) >= 5, "the scenario must make the cache evict"
    # A finished request's KV (its prompt and its outputs but the last) went into the cache;
    # every evicted prefix is the start of such a sequence, and whole nodes: never empty.
    cached = [tuple(t + [7] * 5) for t in sent.values()]
    for event in events:
        prefix = tuple(event["tokens"])
        assert prefix, "an eviction without tokens (only a flush may have none)"
        assert any(seq[: len(prefix)] == prefix for seq in cached), prefix
    assert any(len(e["tokens"]) > len(SHARED) for e in events)  # leaves below the shared part


def test_a_real_flush_is_reported_once() -> None:
    set_policy("vtc")
    engine = Engine(kv_tokens=600)
    run_contended(engine, requests=4, steps=10)
    host = engine.host
    assert host is not None and engine.idle()
    before = host.evictions.next_seq
    engine.cache.reset()  # what SGLang's /flush_cache does to the scheduler's cache
    events = host.evictions.read(before, 100)["events"]
    assert [e["tokens"] for e in events] == [[]]
