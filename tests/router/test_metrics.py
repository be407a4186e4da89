"""The Prometheus counters are the accounting's label totals, read at scrape time: they only
go up, also while the accounting forgets idle clients past its cap, and they add up to what
the accounting counted."""

from __future__ import annotations

import random

from prometheus_client.parser import text_string_to_metric_families

from fairserve.router.accounting import OTHER, Accounting, Usage
from fairserve.router.metrics import RouterMetrics

EMPTY_STATE = {"clients": {}, "workers": [], "jain_index": 1.0}
REQUESTS = "fairserve_router_requests_total"
Key = tuple[str, tuple[tuple[str, str], ...]]


def _key(name: str, **labels: str) -> Key:
    return name, tuple(sorted(labels.items()))


def _counters(metrics: RouterMetrics) -> dict[Key, float]:
    """Every counter and histogram sample, keyed by name and labels."""
    text = metrics.render(EMPTY_STATE).decode()
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        if family.type not in ("counter", "histogram"):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out[_key(sample.name, **sample.labels)] = sample.value
    return out


def _replay(accounting: Accounting, rng: random.Random, requests: int) -> dict[str, int]:
    """Requests of 40 clients (each ends answered, failed, aborted or rejected) against an
    accounting that tracks 5 clients at most; returns the outcomes counted."""
    outcomes: dict[str, int] = {}
    for n in range(requests):
        client = f"c{rng.randrange(40)}"
        now_s = float(n)
        accounting.arrived(client, 5.0, now_s)
        outcome = rng.choice(["finished", "failed", "aborted", "rejected"])
        if outcome == "finished":
            usage = Usage(rng.randrange(1, 50), rng.randrange(0, 2), rng.randrange(1, 20))
            accounting.finished(client, "w", 5.0, usage, rng.random(), rng.random() / 10, now_s)
        else:
            accounting.ended(client, 5.0, outcome)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


def test_counters_only_go_up_while_idle_clients_are_forgotten() -> None:
    rng = random.Random(7)
    accounting = Accounting({"vip": 2.0}, max_clients=5, labels=3)
    metrics = RouterMetrics(accounting)
    before: dict[Key, float] = {}
    counted: dict[str, int] = {}
    for _ in range(20):
        for outcome, count in _replay(accounting, rng, 50).items():
            counted[outcome] = counted.get(outcome, 0) + count
        after = _counters(metrics)
        for key, value in before.items():
            assert after.get(key, 0.0) >= value, key
        before = after
    assert accounting.forgotten > 0, "the point is to forget clients"
    labels = {dict(key[1])["client"] for key in before}
    assert {"vip", OTHER} <= labels and len(labels - {"vip", OTHER}) == 3  # the cap
    by_outcome: dict[str, float] = {}
    for key, value in before.items():
        if key[0] == REQUESTS:
            outcome = dict(key[1])["outcome"]
            by_outcome[outcome] = by_outcome.get(outcome, 0.0) + value
    assert by_outcome == counted  # every request ended is counted once, under one label


def test_a_labelled_client_forgotten_and_back_counts_on() -> None:
    accounting = Accounting({}, max_clients=1, labels=1)
    metrics = RouterMetrics(accounting)
    for client in ("a", "b", "a"):  # b makes the accounting forget a
        accounting.arrived(client, 0.0, 0.0)
        accounting.finished(client, "w", 0.0, Usage(1, 0, 1), 0.1, None, 0.0)
    assert "a" not in accounting.clients or accounting.forgotten
    counters = _counters(metrics)
    assert counters[_key(REQUESTS, client="a", outcome="finished")] == 2
    assert counters[_key(REQUESTS, client=OTHER, outcome="finished")] == 1


def test_the_metrics_keep_no_count_of_their_own() -> None:
    """A scrape reads the accounting as it is now: a count changed there shows at once."""
    accounting = Accounting({})
    metrics = RouterMetrics(accounting)
    accounting.rejected("a")
    key = _key(REQUESTS, client="a", outcome="rejected")
    assert _counters(metrics)[key] == 1
    accounting.rejected("a")
    assert _counters(metrics)[key] == 2
    assert not [name for name in vars(metrics) if name not in _GAUGES_AND_SOURCE]


_GAUGES_AND_SOURCE = {
    "accounting", "registry", "queue_depth", "deficit", "outstanding", "waiting", "healthy",
    "cache_hit_rate", "jain",
}  # fmt: skip
