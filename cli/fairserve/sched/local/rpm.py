"""Requests-per-minute limit: the common production baseline the fair schedulers replace.

Each client may have at most ``limit_per_min`` requests *accepted* in any sliding 60-second
window; an arrival over the limit is refused with
:class:`~fairserve.core.errors.RequestRejected` (hosts answer HTTP 429 with
``Retry-After``). Accepted requests are admitted first come, first served. Isolation comes
only from the cap, so capacity that a capped client could have used stays idle whenever
the others are quiet — the waste VTC and DLPM avoid (VTC §1).

Past ``max_clients`` tracked clients, an idle client is forgotten only once its window is
empty (nothing accepted in the last minute), which changes no decision: its next arrival
would find the window empty anyway. Only its ``rejected`` count, shown in snapshots, goes.
The clients kept are therefore at most ``max_clients`` plus those accepted in the last
minute.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fairserve.core.errors import RequestRejected
from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy, register_local
from fairserve.sched.params import Params, param

WINDOW_S = 60.0
"""Length of the sliding window, seconds (a minute, by the limit's definition)."""


@dataclass(frozen=True, slots=True)
class RPMParams(Params):
    """The cap."""

    limit_per_min: int = param(
        60,
        "requests accepted per client in any sliding 60 s window; more are rejected (429)",
        minimum=0,
        exclusive_minimum=True,
    )


@register_local
class RPM(LocalPolicy):
    """FCFS behind a per-client sliding-window request cap."""

    name = "rpm"
    description = "per-client requests-per-minute cap (excess rejected with 429), then FCFS"
    config: RPMParams

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._accepted_s: dict[str, deque[float]] = {}
        self.rejected: dict[str, int] = {}

    def _arrive(self, req: Request, now_s: float) -> None:
        """Refuse before the request is counted as waiting (it never enters the queue)."""
        self.service.setdefault(req.client, 0.0)  # a refused client still shows up
        window = self._window(req.client, now_s)
        if len(window) >= self.config.limit_per_min:
            retry_after_s = max(window[0] + WINDOW_S - now_s, 1e-9)
            self.rejected[req.client] = self.rejected.get(req.client, 0) + 1
            raise RequestRejected(
                req.client,
                f"over the limit of {self.config.limit_per_min} requests per minute",
                retry_after_s,
            )
        window.append(now_s)

    def _window(self, client: str, now_s: float) -> deque[float]:
        """The client's accepted arrival times within the last ``WINDOW_S``, oldest first."""
        window = self._accepted_s.setdefault(client, deque())
        while window and window[0] <= now_s - WINDOW_S:
            window.popleft()
        return window

    def _forgettable(self, now_s: float) -> Callable[[str], bool]:
        """Idle clients with nothing accepted in the last ``WINDOW_S``."""
        return lambda client: not self._window(client, now_s)

    def _forget(self, client: str) -> None:
        self._accepted_s.pop(client, None)
        self.rejected.pop(client, None)

    def _client_state(self, client: str) -> dict[str, Any]:
        return {
            "accepted_in_window": len(self._accepted_s.get(client, ())),
            "rejected": self.rejected.get(client, 0),
        }
