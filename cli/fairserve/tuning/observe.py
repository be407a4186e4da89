"""What the auto-tuner sees: fairness and locality over the last window, from two router
state snapshots.

The router's own ``jain_index`` and ``max_service_gap`` cover its whole uptime, so they
barely move after a quantum change. The tuner needs the effect of the *current* quantum,
so it differences snapshots of the cumulative counters taken during a window:

* **backlogged clients**: those with requests inside the router in every snapshot of the
  window, served or not (a client that is served as soon as it asks is not competing, and
  its lower rate says nothing about fairness; a starved one is the point);
* **Jain's index** over their weight-normalised service in the window (DESIGN §7's
  definition, restricted to the window);
* **service gap**: the largest difference of weight-normalised service between two of them
  in the window (what DLPM's ``2·(U + Q^u)`` bounds);
* **cache hit rate** and **throughput** of the window, to show what a larger quantum buys.

Pure: snapshots in, an :class:`Observation` out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fairserve.core.metrics import jain_index


@dataclass(frozen=True, slots=True)
class Observation:
    """One window of live traffic."""

    window_s: float
    backlogged: tuple[str, ...]
    jain_index: float | None
    """None: fewer than two backlogged clients (no contention, nothing to judge)."""
    service_gap: float | None
    cache_hit_rate: float | None
    """None: no prompt tokens finished in the window."""
    tokens_per_s: float
    service_per_s: float

    @property
    def contended(self) -> bool:
        return self.jain_index is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            "backlogged": list(self.backlogged),
            "jain_index": self.jain_index,
            "service_gap": self.service_gap,
            "cache_hit_rate": self.cache_hit_rate,
            "tokens_per_s": self.tokens_per_s,
            "service_per_s": self.service_per_s,
        }


def observe(snapshots: Sequence[Mapping[str, Any]]) -> Observation:
    """The window from the first to the last of ``/fairserve/v1/state`` snapshots of the same
    router (at least two, in time order; more make "backlogged" more reliable)."""
    if len(snapshots) < 2:
        raise ValueError(f"observe needs at least 2 snapshots, got {len(snapshots)}")
    before, after = snapshots[0], snapshots[-1]
    window_s = max(1e-9, _uptime(after) - _uptime(before))
    old, new = _clients(before), _clients(after)
    every = [_clients(s) for s in snapshots]
    shares: dict[str, float] = {}
    tokens = service = 0.0
    for name, now in new.items():
        then = old.get(name, {})
        delta = _num(now, "service") - _num(then, "service")
        service += delta
        tokens += _tokens(now) - _tokens(then)
        if all(_num(snap.get(name, {}), "queue_depth") > 0 for snap in every):
            shares[name] = max(0.0, delta) / max(1e-12, _num(now, "weight", 1.0))
    backlogged = tuple(sorted(shares))
    jain = gap = None
    if len(shares) >= 2:
        jain = jain_index(shares.values())
        gap = max(shares.values()) - min(shares.values())
    return Observation(
        window_s=window_s,
        backlogged=backlogged,
        jain_index=jain,
        service_gap=gap,
        cache_hit_rate=_hit_rate(before, after),
        tokens_per_s=tokens / window_s,
        service_per_s=service / window_s,
    )


def _hit_rate(before: Mapping[str, Any], after: Mapping[str, Any]) -> float | None:
    old = {w.get("url"): w for w in _workers(before)}
    prompt = cached = 0.0
    for worker in _workers(after):
        then = old.get(worker.get("url"), {})
        prompt += _num(worker, "prompt_tokens") - _num(then, "prompt_tokens")
        cached += _num(worker, "cached_tokens") - _num(then, "cached_tokens")
    return cached / prompt if prompt > 0 else None


def _tokens(client: Mapping[str, Any]) -> float:
    return _num(client, "prompt_tokens") + _num(client, "output_tokens")


def _uptime(state: Mapping[str, Any]) -> float:
    router = state.get("router")
    return _num(router, "uptime_s") if isinstance(router, Mapping) else 0.0


def _clients(state: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    clients = state.get("clients")
    if not isinstance(clients, Mapping):
        return {}
    return {str(k): v for k, v in clients.items() if isinstance(v, Mapping)}


def _workers(state: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    workers = state.get("workers")
    return [w for w in workers if isinstance(w, Mapping)] if isinstance(workers, list) else []


def _num(data: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value)
