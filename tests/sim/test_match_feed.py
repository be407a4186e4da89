"""The simulator's moved-match feed (``sim.match_feed``): a held match is the tree's match
whenever a decision starts, every match that moved is reported, and a decision that reads
the feed asks the tree only about those and the arrivals.

The records staying identical with the feed is ``test_records_equivalence``; here the
feed's own promises are checked, at every decision of an overloaded run.
"""

from __future__ import annotations

from math import ceil

import pytest

from fairserve.core.radix import RadixTree
from fairserve.core.types import TOKEN_BYTES, Request, make_request, tokens_to_key
from fairserve.sim.cluster import simulate
from fairserve.sim.match_feed import FeedMatchLen, MatchFeed
from tests.sim.test_records_equivalence import CASES


def _req(rid: str, tokens: list[int]) -> Request:
    return make_request(rid, "c", tokens, max_output_tokens=4)


def _feed_decision(feed: MatchFeed) -> FeedMatchLen:
    """A decision that reads the feed (as DLPM does before anything else)."""
    decision = feed.begin()
    decision.moved()
    return decision


def test_a_revoked_match_is_reported_moved_and_read_again() -> None:
    tree = RadixTree()
    tree.insert(tokens_to_key([1, 2, 3, 4]))
    feed = MatchFeed(tree)
    waiting = _req("a", [1, 2, 3, 9, 9])
    other = _req("b", [7, 7, 7])
    first = feed.begin()
    assert first.moved() == []
    assert first(waiting) == 3 and first(other) == 0
    tree.insert(tokens_to_key([1, 2, 3, 9]))  # continues ``waiting``'s match only
    second = feed.begin()
    assert second.moved() == [waiting]
    assert second(waiting) == 4 and second(other) == 0


def test_a_frozen_decision_answers_the_match_at_its_start() -> None:
    """An eviction during the decision (an admission made room) does not change what the
    decision reads for a request it did not re-read."""
    tree = RadixTree()
    tree.insert(tokens_to_key([1, 2, 3, 4]))
    feed = MatchFeed(tree)
    waiting = _req("a", [1, 2, 3, 9])
    assert _feed_decision(feed)(waiting) == 3
    decision = feed.begin()
    assert decision.moved() == []
    tree.evict(100)
    assert tree.match_len(tokens_to_key([1, 2, 3, 9])) == 0
    assert decision(waiting) == 3
    after = feed.begin()
    assert after.moved() == [waiting]
    assert after(waiting) == 0


def test_a_decision_without_the_feed_reads_when_first_asked() -> None:
    tree = RadixTree()
    tree.insert(tokens_to_key([1, 2, 3, 4]))
    feed = MatchFeed(tree)
    waiting = _req("a", [1, 2, 3, 9])
    decision = feed.begin()
    tree.evict(100)
    assert decision(waiting) == 0  # first asked after the eviction
    tree.insert(tokens_to_key([1, 2, 3, 4]))
    assert decision(waiting) == 0  # then kept for the decision


def test_departed_requests_are_forgotten() -> None:
    tree = RadixTree()
    tree.insert(tokens_to_key([1, 2, 3, 4]))
    feed = MatchFeed(tree)
    waiting = _req("a", [1, 2, 3, 9])
    _feed_decision(feed)(waiting)
    feed.left(waiting)
    tree.insert(tokens_to_key([1, 2, 3, 9]))
    decision = feed.begin()
    assert decision.moved() == []
    assert not feed.held


def test_too_many_revocations_make_every_match_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    from fairserve.core import radix_matches

    monkeypatch.setattr(radix_matches, "MAX_REVOKED", 0)
    tree = RadixTree()
    tree.insert(tokens_to_key([1, 2, 3, 4]))
    feed = MatchFeed(tree)
    waiting = _req("a", [1, 2, 3, 9, 9])
    _feed_decision(feed)(waiting)
    tree.insert(tokens_to_key([1, 2, 3, 9]))
    decision = feed.begin()
    assert decision.moved() is None
    assert decision(waiting) == 4


@pytest.mark.parametrize("case", ["tot-overload", "dlpm-retracting"])
def test_held_matches_are_the_trees_at_every_decision(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs of the equivalence tests (overloaded; retracting), checked at every decision's
    start: every held match equals a fresh read (so what the feed does not report did not
    move), every held claim is the request's, and decisions read the feed."""
    checked = {"held": 0, "decisions": 0, "moved_calls": 0}
    begin, moved = MatchFeed.begin, FeedMatchLen.moved

    def checking_begin(self: MatchFeed) -> FeedMatchLen:
        decision = begin(self)
        for req, held in self.held.items():
            assert held == self.read_unheld(req), req.id
            remaining = req.max_output_tokens - req.output_tokens
            reserve = ceil(config.engine.reserve_output_ratio * remaining) if remaining > 0 else 0
            prompt = len(req.prompt_key) // TOKEN_BYTES
            assert self.needs[req] == prompt - held + req.output_tokens + reserve, req.id
        checked["held"] += len(self.held)
        checked["decisions"] += 1
        return decision

    def counting_moved(self: FeedMatchLen) -> list[object] | None:
        checked["moved_calls"] += 1
        return moved(self)  # type: ignore[return-value]

    workload, config, _digest = CASES[case]
    monkeypatch.setattr(MatchFeed, "begin", checking_begin)
    monkeypatch.setattr(FeedMatchLen, "moved", counting_moved)
    simulate(workload(), config)
    assert checked["decisions"] > 100 and checked["moved_calls"] > 100
    assert checked["held"] > 10 * checked["decisions"]  # queues long enough to matter


def test_settling_without_a_decision_keeps_the_revocations_short() -> None:
    """Batch formations that decide nothing (nothing fits) still drain the tree's list."""
    tree = RadixTree()
    tree.insert(tokens_to_key([1, 2, 3, 4]))
    feed = MatchFeed(tree)
    waiting = _req("a", [1, 2, 3, 9, 9])
    _feed_decision(feed)(waiting)
    tree.insert(tokens_to_key([1, 2, 3, 9]))
    feed.settle()
    assert tree.drain_revoked() == []
    decision = feed.begin()
    assert decision.moved() == [waiting]  # still reported to the next decision
