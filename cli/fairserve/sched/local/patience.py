"""The memory patience shared by the skipping local policies (VTC, LCF, Justitia, DLPM's
fill): how long a client blocked on memory may be bypassed before admissions wait for it.
"""

from __future__ import annotations

from typing import Any


class MemoryPatience:
    """Keeps a client blocked on memory from being bypassed indefinitely (issue 17).

    Why: a policy that skips a request which does not fit and admits the ones behind it
    (work conservation) lets the memory freed by small requests flow to the clients that
    send small requests for ever, while the most entitled client's larger request never
    fits. VTC's Theorem 4.4 and DLPM's Theorems 4.1/4.2 assume the opposite (Algorithm 2's
    ``Break``; Algorithm 1's credit-holder blocking refills); with mixed sizes the gap then
    grows linearly (seen: 127k against a 40k bound).

    How: a policy reports, at the end of every decision, which client was the most entitled
    one left blocked on memory (``None`` if none) and whether anything was admitted past it
    (a *bypass*). After ``patience`` consecutive bypasses of the same client, :attr:`hold`
    is true: the policy stops admitting at the first most-entitled request that does not fit
    (Algorithm 2's ``Break``), so the memory that frees up accumulates for it. Running
    requests keep decoding, so the worker never idles while it holds requests. The hold
    ends when a decision ends with nobody blocked or with another client blocked (the held
    client was served until it stopped being the most entitled).

    Sense of work conservation: that of VTC §4.3, "stops adding requests to a partially
    filled batch only when it runs out of memory (for the next request in fairness order),
    never for fairness reasons"; strict skipping, for up to ``patience`` decisions in a row.

    Bound: while held the policy is Algorithm 2 (VTC) or Algorithm 1 (DLPM) exactly, so the
    proofs' steps apply; an episode of bypasses lets the bypassed client fall behind by at
    most what ``patience`` decisions admit past it (at most ``patience·w_p·M`` prompt
    service, M the pool's tokens; in practice one step's freed memory per decision), after
    which it is served until it is no longer the most entitled. Hence VTC's gap is at most
    ``2·max(w_p·L_input, w_q·M) + patience·w_p·M`` in the worst case, and measured within
    the theorem's own ``2·max(w_p·L_input, w_q·M)`` on memory-bound mixed-size workloads
    with the default patience (``tests/sched/test_local_memory_bound.py``; pure skipping
    reached up to 4.4x that bound there).

    ``patience=0`` is Algorithm 2 exactly; a huge value is pure skipping. Policies call
    :meth:`decided` once per decision and read :attr:`hold` before it (Justitia and other
    skipping policies: same two calls)."""

    __slots__ = ("blocked", "bypasses", "patience")

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.bypasses = 0
        """Consecutive decisions that bypassed :attr:`blocked`."""
        self.blocked: object = None
        """The most entitled client left blocked by the last decision (None: none)."""

    @property
    def hold(self) -> bool:
        """Whether this decision must stop at the first most-entitled request that does
        not fit, instead of admitting what still fits behind it."""
        return self.bypasses >= self.patience

    def state(self) -> dict[str, Any]:
        """JSON-able: whom admissions are held for (dashboards explain a pause with it)."""
        return {
            "bypasses": self.bypasses,
            "held": self.hold,
            "blocked": None if self.blocked is None else str(self.blocked),
        }

    def decided(self, blocked: object, bypassed: bool) -> None:
        """Record a decision's end: the most entitled client left blocked on memory
        (``None``: nobody) and whether requests of others were admitted past it."""
        if blocked is None:
            self.bypasses = 0
        elif blocked != self.blocked:
            self.bypasses = 1 if bypassed else 0
        elif bypassed:
            self.bypasses += 1
        self.blocked = blocked
