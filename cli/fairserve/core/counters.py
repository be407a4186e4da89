"""Cumulative counters that several hosts keep alike, defined once.

The simulator's engine (``sim.engine_types.EngineStats``), the SGLang plugin's engine
(``sglang.requests.EngineCounters``) and the router's per-worker counts
(``router.accounting.WorkerStats``) each counted prompt and cached tokens with the same
hit-rate rule, and the two engines the same step counters, in copies that could drift.
Here they are one definition each; the hosts extend them with what only they count.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


def hit_rate(cached_tokens: int, prompt_tokens: int) -> float:
    """Cached / prompt tokens (0 before any prompt): the one rule for every host."""
    return cached_tokens / prompt_tokens if prompt_tokens else 0.0


@dataclass(slots=True)
class TokenCounts:
    """Prompt tokens seen and how many of them were found in the prefix cache."""

    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return hit_rate(self.cached_tokens, self.prompt_tokens)


@dataclass(slots=True)
class EngineCounts:
    """An engine's cumulative step counters: the ``engine`` section of a worker's state,
    and what the simulator's reports read. Not a :class:`TokenCounts`: a subclass would put
    the token counts first, and the simulator's records serialise these fields in order."""

    steps: int = 0
    busy_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    admitted: int = 0
    finished: int = 0
    retracted: int = 0
    aborted: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return hit_rate(self.cached_tokens, self.prompt_tokens)

    def as_json(self) -> dict[str, Any]:
        """The counters under the names (and in the order) the worker state shows them;
        a subclass's own fields are not among them."""
        counts = {f.name: getattr(self, f.name) for f in fields(EngineCounts)}
        return {**counts, "cache_hit_rate": self.cache_hit_rate}
