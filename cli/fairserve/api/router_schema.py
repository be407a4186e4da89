"""The documents of the router's admin API (``/fairserve/v1/...``), as their readers see them.

``router.state`` builds them; ``top`` (``tui.parse``), ``tune`` and ``status`` read them.
Every key is optional (``total=False``): a reader must tolerate an older router that lacks
a key and a newer one that adds some, so these types say what a key holds *when present*.
Infinite quanta travel as the string ``"inf"`` (:mod:`fairserve.api.jsonsafe`), hence the
``float | str`` of the quantum fields.
"""

from __future__ import annotations

from typing import Any, TypedDict

JsonNumber = float | int | str
"""A number as the JSON rule writes it: ``"inf"``/``"-inf"`` for infinities."""


class RouterQuantum(TypedDict, total=False):
    """``GET /fairserve/v1/quantum`` (and the ``quantum`` key of the state); a ``PUT``
    answers the same document plus ``worker_errors``."""

    dispatch: str
    worker_quantum: JsonNumber | None
    policy: str
    quantum: JsonNumber | None
    quantum_source: str | None
    worker_quanta: dict[str, JsonNumber | None]
    worker_errors: list[str]


class RouterWeights(TypedDict, total=False):
    """``GET /fairserve/v1/weights``: every client's weight and those changed live."""

    weights: dict[str, float]
    changed: dict[str, float]


class WeightResult(TypedDict, total=False):
    """``PUT /fairserve/v1/weights``: the new weight and where it was applied; ``workers``
    maps each worker to ``ok``, ``unsupported`` or the error."""

    client: str
    weight: float
    previous: float
    router_queues: int
    workers: dict[str, str]


class RouterInfo(TypedDict, total=False):
    """The ``router`` key of the state."""

    url: str | None
    version: str
    uptime_s: float
    draining: bool
    active_requests: int
    dispatch: str
    policy: str
    router_queue: str
    settings: dict[str, Any]
    auth_mode: str
    slots: dict[str, int]
    """Requests waiting in the router for room on a worker now, and so far: waited, and
    timed out (answered 503 after ``--queue-timeout``)."""


class RouterState(TypedDict, total=False):
    """``GET /fairserve/v1/state`` (``router.state.snapshot``); clients and workers stay
    loose mappings (their many keys are read one by one with defaults)."""

    router: RouterInfo
    quantum: RouterQuantum
    fairness: dict[str, Any]
    jain_index: float
    jain_window_s: list[float] | None
    max_service_gap: float
    max_request_cost: float | None
    throughput: dict[str, float]
    clients_total: int
    clients_shown: int
    clients: dict[str, dict[str, Any]]
    workers: list[dict[str, Any]]
    dispatcher: dict[str, Any]
