"""Where ``launch --ray`` puts each worker: pure code over the cluster's nodes (no Ray here).

The plan is made before anything starts, from what each node has free, so ``--dry-run``
shows exactly what a launch would do and a cluster too small is refused with what is free
where, instead of placement groups that wait forever. Each worker then gets a placement
group pinned to its planned node (``ray_fleet``), so the plan is also what runs.

Workers are *spread*: each goes to the node with the most free GPUs that can hold it, so a
lost node takes as few workers with it as possible and the router keeps the most capacity.
A worker's GPUs are always on one node (tensor parallelism needs them together).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fairserve.core.errors import FairserveError


class NotEnoughGpus(FairserveError):
    """The cluster's free GPUs cannot hold the planned workers; the message says what is
    free on which node."""


@dataclass(frozen=True)
class NodeCapacity:
    """One live node as Ray reports it: its id, address, and GPUs (total and free now)."""

    node_id: str
    address: str
    total_gpus: float
    free_gpus: float

    @property
    def label(self) -> str:
        """How messages name the node: its address and the start of its id."""
        return f"{self.address} ({self.node_id[:8]})"


@dataclass(frozen=True)
class Placement:
    """Worker ``index`` runs on ``node`` with ``gpus`` of its GPUs."""

    index: int
    node: NodeCapacity
    gpus: int

    @property
    def name(self) -> str:
        return f"worker-{self.index}"


def place(nodes: Sequence[NodeCapacity], workers: int | None, gpus: int) -> list[Placement]:
    """``workers`` workers of ``gpus`` GPUs each (None: as many as the free GPUs hold).

    Raises :class:`NotEnoughGpus` when they do not fit (or, for None, when not even one
    does); ``gpus`` 0 (simulated workers without a logical GPU) needs a worker count."""
    if gpus < 0:
        raise FairserveError(f"GPUs per worker: expected 0 or more, got {gpus}")
    if workers is None and gpus == 0:
        raise FairserveError("--workers is required when the workers reserve no GPU")
    free = {n.node_id: math.floor(n.free_gpus + 1e-9) for n in nodes}
    count = {n.node_id: 0 for n in nodes}
    order = {n.node_id: i for i, n in enumerate(nodes)}
    placements: list[Placement] = []
    while workers is None or len(placements) < workers:
        fitting = [n for n in nodes if free[n.node_id] >= gpus]
        if not fitting:
            break
        node = min(fitting, key=lambda n: (-free[n.node_id], count[n.node_id], order[n.node_id]))
        free[node.node_id] -= gpus
        count[node.node_id] += 1
        placements.append(Placement(len(placements), node, gpus))
    if not placements or (workers is not None and len(placements) < workers):
        raise NotEnoughGpus(_shortfall(nodes, workers, gpus, len(placements)))
    return placements


def _shortfall(nodes: Sequence[NodeCapacity], workers: int | None, gpus: int, fit: int) -> str:
    wanted = "a worker" if workers is None else f"{workers} workers"
    free = "; ".join(
        f"{n.label}: {math.floor(n.free_gpus + 1e-9)} of {n.total_gpus:g} free" for n in nodes
    )
    return (
        f"not enough GPUs on the Ray cluster for {wanted} of {gpus} GPU(s) each on one node "
        f"(room for {fit}); free GPUs per node: {free or 'no live node'}"
    )


def describe_nodes(nodes: Sequence[NodeCapacity]) -> list[dict[str, object]]:
    """The nodes as ``--dry-run --json`` shows them."""
    return [
        {"node_id": n.node_id, "address": n.address, "gpus": n.total_gpus, "free_gpus": n.free_gpus}
        for n in nodes
    ]
