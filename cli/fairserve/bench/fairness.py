"""The router's fairness view of a bench run: the same ledger, fed the same events.

``fairserve top`` and ``/fairserve/v1/state`` judge fairness with
:class:`~fairserve.core.ledger.ServiceLedger`: each client busy while it has a request
inside, prompt service credited at the first token, output as it streams, rates over each
client's own active span in a sliding window. Replaying the run's calls into the same
ledger gives the bench report a ``fairness`` block that reads like the router's, so the
client side and the server side can be compared number for number (the DESIGN §7
``jain_index`` of the report keeps its own definition: the window where every client is
active).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from fairserve.bench.client import Attempt
from fairserve.core.cost import WeightedTokenCost
from fairserve.core.ledger import MAX_WINDOW_S, ServiceLedger

COST = WeightedTokenCost()
SAMPLE_INTERVAL_S = 1.0
"""As the router samples who is backlogged (``sample_interval_s``)."""
OUTPUT_PIECES = 8
"""An answer's output service is credited in this many steps between first token and end."""

# Event order at one instant: arrivals first, then service, then departures.
_BUSY, _CREDIT, _IDLE = 0, 1, 2


def live_fairness(
    attempts: Iterable[Attempt], weights: Mapping[str, float], end_s: float
) -> dict[str, Any]:
    """The router-style ``fairness`` block over the whole run (capped at the ledger's
    longest window), ending at ``end_s``."""
    ledger = ServiceLedger()
    for name, weight in weights.items():
        ledger.add_client(name, weight, 0.0)
    events = sorted(_events(list(attempts), end_s))
    next_sample_s = SAMPLE_INTERVAL_S
    for t_s, kind, client, amount in events:
        while next_sample_s <= t_s:
            ledger.sample(next_sample_s)
            next_sample_s += SAMPLE_INTERVAL_S
        ledger.add_client(client, weights.get(client, 1.0), t_s)
        if kind == _BUSY:
            ledger.busy(client, t_s)
        elif kind == _IDLE:
            ledger.idle(client, t_s)
        else:
            ledger.credit(client, amount, t_s)
    ledger.sample(end_s)
    window_s = min(MAX_WINDOW_S, max(end_s, 1e-9))
    view = ledger.window(window_s, end_s)
    return {
        **view.to_json(),
        "definition": "as the router's /fairserve/v1/state and top (core.ledger)",
    }


def service_events(attempts: Iterable[Attempt]) -> list[tuple[float, str, float]]:
    """``(t_s, client, service)`` of every answered call, as the client saw it arrive: the
    prompt at the first token, the output in ``OUTPUT_PIECES`` even steps until the end
    (the report's service curve and this ledger both read it)."""
    events: list[tuple[float, str, float]] = []
    for a in attempts:
        if not a.ok or a.finish_s is None:
            continue
        first_s = a.first_token_s if a.first_token_s is not None else a.finish_s
        events.append((first_s, a.client, COST.w_e * a.prompt_tokens))
        pieces = max(1, min(OUTPUT_PIECES, a.completion_tokens))
        share = COST.w_q * a.completion_tokens / pieces
        step_s = (a.finish_s - first_s) / pieces
        events.extend((first_s + (k + 1) * step_s, a.client, share) for k in range(pieces))
    return events


def _events(attempts: list[Attempt], end_s: float) -> list[tuple[float, int, str, float]]:
    """The ledger's events: busy when sent, service as it arrived, idle at the end."""
    events = [(t_s, _CREDIT, client, service) for t_s, client, service in service_events(attempts)]
    for a in attempts:
        if a.sent_s is None:
            continue
        finish_s = a.finish_s if a.finish_s is not None else end_s
        events.append((a.sent_s, _BUSY, a.client, 0.0))
        events.append((finish_s if math.isfinite(finish_s) else end_s, _IDLE, a.client, 0.0))
    return events
