"""The Prometheus totals of the router's clients, by label.

Prometheus counters (``router.metrics`` renders them at scrape time, keeping no count of its
own) must only go up, so they cannot be read off clients that may be forgotten
(:class:`~fairserve.router.accounting.Accounting` tracks a bounded number of them). Each
client counts, besides its own figures, into the :class:`Totals` of its *label*: its name
for the clients of the clients file and the first ``labels`` other names seen (sticky,
never re-ranked), ``other`` for the rest. A label's totals outlive the forgetting of its
clients, and there are at most ``labels`` + the clients file's + 1 of them.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import NamedTuple

OTHER = "other"
"""The label of the clients beyond ``labels``."""
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 60, 120, 300)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Histogram:
    """Bucket counts (not cumulative; the last one is ``+Inf``) and the sum."""

    __slots__ = ("bounds", "counts", "total_s")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total_s = 0.0

    def observe(self, value_s: float) -> None:
        self.counts[bisect_left(self.bounds, value_s)] += 1
        self.total_s += value_s

    def copy(self) -> Histogram:
        twin = Histogram(self.bounds)
        twin.counts, twin.total_s = list(self.counts), self.total_s
        return twin


class Totals:
    """The cumulative counts of one Prometheus label: requests by outcome, and of the
    answered requests their final service, tokens, latency and TTFT. Never decrease."""

    __slots__ = ("cached", "completion", "latency", "outcomes", "prompt", "service", "ttft")

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.service = 0.0
        self.prompt = 0
        self.cached = 0
        self.completion = 0
        self.latency = Histogram(LATENCY_BUCKETS_S)
        self.ttft = Histogram(TTFT_BUCKETS_S)

    def ended(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def copy(self) -> Totals:
        """These totals as they are now (a scrape renders the copy while counting goes on)."""
        twin = Totals()
        twin.outcomes = dict(self.outcomes)
        twin.service, twin.prompt = self.service, self.prompt
        twin.cached, twin.completion = self.cached, self.completion
        twin.latency, twin.ttft = self.latency.copy(), self.ttft.copy()
        return twin

    def answered(
        self, service: float, usage: Usage, latency_s: float, ttft_s: float | None
    ) -> None:
        outcomes = self.outcomes
        outcomes["finished"] = outcomes.get("finished", 0) + 1
        self.service += service
        self.prompt += usage.prompt_tokens
        self.cached += usage.cached_tokens
        self.completion += usage.completion_tokens
        self.latency.observe(latency_s)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)


class Usage(NamedTuple):
    """Tokens of one finished request, as the worker reported them (a tuple: one is built
    per request, and a frozen dataclass costs several times more to create)."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


NO_USAGE = Usage(0, 0, 0)
"""Nothing credited yet."""
