"""Kept prefix matches (``fairserve.sglang.matches``) against SGLang's real radix cache.

A kept match must equal what SGLang's own matching says at every step, after any mix of what
SGLang does to its tree between two batching steps: inserts (admitted prompts, finished
requests), evictions, lock and unlock, its own ``match_prefix`` (which splits nodes where
matches end), a reset; and requests arriving, leaving or coming back with outputs
(retracted). And the plugin's decisions with kept matches must be those with every match
walked again, inside SGLang's scheduling loop."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.sglang_real.real import require_sglang

require_sglang()

from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams  # noqa: E402

from fairserve.sglang.matches import KeptMatches  # noqa: E402
from tests.sglang_real.harness import Engine, Step, set_policy  # noqa: E402
from tests.sglang_real.trees import NAMESPACES, Tree, make_req  # noqa: E402

DOCUMENTS = [[d * 1000 + i for i in range(60)] for d in range(1, 5)]
"""Shared prefixes; prompts cut them at random points, so matches end inside edges too."""


def prompt(rng: random.Random) -> list[int]:
    document = rng.choice(DOCUMENTS)
    cut = rng.randint(0, len(document))
    return [*document[:cut], *(rng.randint(1, 6) for _ in range(rng.randint(0, 12)))] or [1]


def mutate(tree: Tree, rng: random.Random, waiting: list[Req]) -> None:
    """One batching step's worth of changes to the tree, in random order."""
    for _ in range(rng.randint(0, 4)):
        roll = rng.random()
        if roll < 0.40:
            source = rng.choice(waiting) if waiting and rng.random() < 0.5 else None
            if source is not None:  # an admitted prompt (or part of it) enters the tree
                tokens = list(source.origin_input_ids + source.output_ids)
                tree.insert(tokens[: rng.randint(1, len(tokens))], source.extra_key)
            else:
                tree.insert(prompt(rng), rng.choice(NAMESPACES))
        elif roll < 0.65:
            tree.evict()
        elif roll < 0.75 and waiting:
            tree.lock(rng.choice(waiting))
        elif roll < 0.85:
            tree.unlock()
        elif roll < 0.99 and waiting:
            tree.sglang_match(rng.choice(waiting))
        elif roll >= 0.995:
            tree.reset()


def churn(rng: random.Random, waiting: list[Req], serial: list[int]) -> None:
    """Requests arrive, some leave (admitted or aborted), some come back with outputs."""
    for _ in range(rng.randint(0, 3)):
        serial[0] += 1
        waiting.append(make_req(f"r{serial[0]}", prompt(rng), rng.choice(NAMESPACES)))
    for _ in range(rng.randint(0, 2)):
        if waiting:
            gone = waiting.pop(rng.randrange(len(waiting)))
            if rng.random() < 0.3:  # retracted: back with the outputs it produced
                gone.output_ids.extend(rng.randint(1, 6) for _ in range(rng.randint(1, 5)))
                waiting.append(gone)


@pytest.mark.parametrize(("seed", "page_size"), [(s, 1) for s in range(5)] + [(5, 4), (6, 16)])
def test_kept_matches_equal_sglangs_own_matching_after_every_step(
    seed: int, page_size: int
) -> None:
    rng = random.Random(seed)
    tree = Tree(rng, page_size)
    kept, fresh = KeptMatches(), KeptMatches(keep=False)
    waiting: list[Req] = []
    serial = [0]
    shapes = {"boundary": 0, "inside": 0}
    for _step in range(300):
        churn(rng, waiting, serial)
        mutate(tree, rng, waiting)
        answer = kept.begin(tree.cache)
        walk = fresh.begin(tree.cache)
        assert answer is not None and walk is not None, "the harness's cache is supported"
        for req in waiting:
            expected = tree.read_only_match(req)
            assert answer(req) == expected, (req.rid, tree.counts)
            assert walk(req) == expected
        kept.end()
        fresh.end()
        for entry in kept.kept.values():
            shapes["boundary" if entry.parent is None else "inside"] += 1
        if waiting and rng.random() < 0.5:  # SGLang's own match agrees too
            req = rng.choice(waiting)
            assert tree.sglang_match(req) == tree.read_only_match(req)
    assert all(tree.counts.values()), tree.counts
    assert shapes["inside"] > 0 and shapes["boundary"] > 0, shapes
    # Kept matches walk only where the tree changed: far fewer walks than matches asked.
    assert kept.reused > 2 * kept.walks, (kept.reused, kept.walks)
    assert fresh.reused == 0


@pytest.mark.parametrize(("seed", "page_size"), [(s, 1) for s in range(5)] + [(5, 4), (6, 16)])
def test_asking_only_about_stale_matches_keeps_every_match_right(seed: int, page_size: int) -> None:
    """The host's way (``stale()``): after each step it asks only about new requests, those
    that came back with outputs, and those ``stale()`` names, and keeps every other answer;
    every kept answer must still be SGLang's own match, while far fewer are asked."""
    rng = random.Random(seed)
    tree = Tree(rng, page_size)
    kept = KeptMatches()
    waiting: list[Req] = []
    serial = [0]
    known: dict[str, tuple[int, int | None]] = {}
    """rid -> (tokens when asked, the answer)."""
    asked = held = 0
    for _step in range(300):
        churn(rng, waiting, serial)
        mutate(tree, rng, waiting)
        present = {str(r.rid): r for r in waiting}
        for rid in [rid for rid in known if rid not in present]:
            kept.forget(rid)  # admitted or aborted
            del known[rid]
        answer = kept.begin(tree.cache)
        assert answer is not None
        stale = set(kept.stale())
        for rid, req in present.items():
            tokens = len(req.origin_input_ids) + len(req.output_ids)
            was = known.get(rid)
            if was is not None and was[0] != tokens:  # came back with outputs (retracted)
                kept.forget(rid)
                was = None
            if was is None or rid in stale:
                known[rid] = (tokens, answer(req))
                asked += 1
            held += 1
            assert known[rid][1] == tree.read_only_match(req), (rid, tree.counts)
    assert all(tree.counts.values()), tree.counts
    assert asked < held / 2, (asked, held)


def test_an_insert_on_the_path_or_an_eviction_moves_the_kept_match() -> None:
    """The three ways a match moves, each seen by the signal (not by luck of a re-walk)."""
    rng = random.Random(0)
    tree = Tree(rng)
    kept = KeptMatches()
    doc = DOCUMENTS[0]
    req = make_req("q", [*doc[:40], 9, 9], None)

    def match() -> int:
        answer = kept.begin(tree.cache)
        assert answer is not None
        length = answer(req)
        kept.end()
        assert length == tree.read_only_match(req)
        return int(length or 0)

    assert match() == 0
    tree.insert(doc[:20], None)  # a child under the root for the request's head
    assert match() == 20
    tree.insert([*doc[:30], 5], None)  # extends the node the match ends at: inside an edge
    assert match() == 30
    walks = kept.walks
    tree.insert([77, 78], None)  # elsewhere: the kept match stands
    assert match() == 30 and kept.walks == walks
    tree.insert([*doc[:40], 9, 9, 9], None)  # splits the edge the match ends inside
    assert match() == 42
    tree.evict()  # evicts leaves, LRU first, down to what is locked
    tree.cache.evict(EvictParams(num_tokens=10_000))
    assert match() == 0


# ---------------------------------------------------------------- inside the scheduling loop
def run(keep: bool | None, seed: int, steps: int) -> tuple[list[Step], Any]:
    """The plugin with DLPM in SGLang's loop, its queue kept above SGLang's LPM limit
    (128 waiting) for part of the run; ``keep``: kept matches, walked every step
    (False), or SGLang's ``prefix_len`` only (None)."""
    set_policy("dlpm", 200.0)
    engine = Engine(kv_tokens=1500, max_running=24, new_token_ratio=0.1)
    host = engine.host
    assert host is not None
    host.matches = None if keep is None else KeptMatches(keep=keep)
    rng = random.Random(seed)
    record = []
    for step in range(steps):
        if step < steps // 2:
            for _ in range(rng.randint(2, 12)):
                client = rng.randrange(4)
                document = DOCUMENTS[client]
                tokens = [*document[: rng.randint(10, 60)], *(rng.randint(1, 9) for _ in range(8))]
                engine.add(f"r{step}-{_}", tokens, rng.randint(2, 30), f"c{client}")
        record.append(engine.step())
    return record, host


@pytest.mark.parametrize("seed", range(2))
def test_decisions_with_kept_matches_are_those_with_every_match_walked_again(seed: int) -> None:
    kept_record, kept_host = run(True, seed, 160)
    fresh_record, fresh_host = run(False, seed, 160)
    assert max(len(s.prefill.matched) for s in kept_record if s.prefill) > 128
    admitted = [s.prefill.admitted if s.prefill else [] for s in kept_record]
    assert admitted == [s.prefill.admitted if s.prefill else [] for s in fresh_record]
    assert kept_host.policy.snapshot() == fresh_host.policy.snapshot()
    assert kept_host.matches.reused > kept_host.matches.walks


def test_above_sglangs_lpm_limit_the_policy_is_told_real_matches() -> None:
    """Above 128 waiting SGLang orders FCFS and matches nothing, so ``prefix_len`` is what
    an earlier match left (0 for a request never matched); the policy is told the match
    in the tree as it is now."""
    set_policy("dlpm", 200.0)
    engine = Engine(kv_tokens=4000, max_running=4)
    host = engine.host
    assert host is not None
    told: list[dict[str, int]] = []
    original = host.policy.decide

    def decide(waiting: Any, match_len: Any, now_s: float) -> Any:
        told.append({r.id: match_len(r) for r in waiting})
        return original(waiting, match_len, now_s)

    host.policy.decide = decide  # type: ignore[method-assign]
    document = DOCUMENTS[0]
    engine.add("warm", [*document, 1], 1, "c0")
    engine.run(3)  # the document is in the tree
    for i in range(200):
        engine.add(f"r{i}", [*document[:50], 100 + i], 4, f"c{i % 3}")
    engine.step()
    last = told[-1]
    stale = {str(r.rid): int(r.prefix_len) for r in engine.waiting_queue}
    assert len(last) > 128
    assert set(last.values()) == {50}
    assert set(stale.values()) == {0}
