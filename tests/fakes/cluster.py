"""A deterministic multi-worker harness: step engines behind a global dispatcher.

N :class:`~tests.fakes.engine.StepEngine` workers, each with its own local policy, advance
in lock step. At every step the arrivals of that step are dispatched with
``dispatcher.dispatch(req)`` and submitted to the chosen worker; then every worker runs one
step, and its finished requests (``on_finish``) and cache evictions (``on_evict``, the keys
``RadixTree.evict`` returned) are reported back to the dispatcher, as a router would.

It records two cluster-wide :class:`~fairserve.core.metrics.ServiceSample` histories of the
service each client had *processed* (``w_e``·extend + ``w_q``·decoded), summed over workers:

* ``samples`` — a client is backlogged when it has a waiting request on **any** worker: the
  client's own view (it has work in the system that is not running). Theorem A.5 (``Q^w =
  inf`` is unfair) is about this notion: the sticky client is backlogged, only not
  everywhere.
* ``samples_all`` — backlogged when it has a waiting request on **every** worker. This is
  the premise the proof of Theorem 5.1 rests on ("if a client is backlogged, it will be
  backlogged in all workers"): then each worker's local DLPM bound ``2·(U + Q^u)`` holds per
  worker and adds up to ``2·|W|·(U + Q^u)``. The dispatcher's job is to make the premise
  true; a dispatcher that concentrates a client on one worker breaks it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fairserve.core.metrics import ServiceSample
from fairserve.core.radix import RadixTree
from fairserve.core.types import Request, make_request
from fairserve.sched.dispatch.base import Dispatcher
from fairserve.sched.local.base import LocalPolicy
from tests.fakes.engine import StepEngine


class RecordingTree(RadixTree):
    """A prefix cache that keeps the eviction events ``evict`` returns, for forwarding."""

    def __init__(self) -> None:
        super().__init__()
        self.pending_evictions: list[bytes] = []

    def evict(self, num_tokens: int) -> list[bytes]:
        keys = super().evict(num_tokens)
        self.pending_evictions.extend(keys)
        return keys

    def drain(self) -> list[bytes]:
        keys, self.pending_evictions = self.pending_evictions, []
        return keys


@dataclass
class ClusterEngine(StepEngine):
    """A step engine whose prefix cache reports its evictions."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.recording = RecordingTree()
        self.tree = self.recording


@dataclass
class Cluster:
    """Workers ``w0..wN-1`` in lock step behind ``dispatcher``."""

    engines: dict[str, ClusterEngine]
    dispatcher: Dispatcher
    forward_evictions: bool = True
    now: int = 0
    samples: list[ServiceSample] = field(default_factory=list)
    samples_all: list[ServiceSample] = field(default_factory=list)
    placement: dict[str, str] = field(default_factory=dict)
    evictions_forwarded: int = 0

    def submit(self, req: Request) -> str:
        """Dispatch ``req`` and queue it on the chosen worker; returns the worker."""
        worker = self.dispatcher.dispatch(req)
        engine = self.engines[worker]
        rejected_before = len(engine.rejected)
        engine.submit(req)
        if len(engine.rejected) > rejected_before:
            self.dispatcher.on_abort(req, worker)
        self.placement[req.id] = worker
        return worker

    def step(self) -> None:
        """One step on every worker, then report finishes and evictions, then sample."""
        for worker, engine in self.engines.items():
            done_before = len(engine.finished)
            engine.step()
            for req in engine.finished[done_before:]:
                self.dispatcher.on_finish(req, worker, req.output_tokens)
            evicted = engine.recording.drain()
            if self.forward_evictions:
                for key in evicted:
                    self.dispatcher.on_evict(worker, key)
                self.evictions_forwarded += len(evicted)
        self.now += 1
        self._sample()

    def run(self, arrivals: Mapping[int, Sequence[Request]], max_steps: int) -> None:
        """Feed ``arrivals`` (step → requests) and step until idle or ``max_steps``."""
        last_arrival = max(arrivals, default=0)
        for _ in range(max_steps):
            for req in arrivals.get(self.now, ()):
                self.submit(req)
            if self.idle() and self.now > last_arrival:
                break
            self.step()

    def idle(self) -> bool:
        return all(not e.waiting and not e.running for e in self.engines.values())

    def served(self) -> dict[str, float]:
        """Cumulative processed service per client, summed over workers."""
        total: dict[str, float] = {}
        for engine in self.engines.values():
            for client, amount in engine.served.items():
                total[client] = total.get(client, 0.0) + amount
        return total

    def workers_of(self, client: str) -> dict[str, int]:
        """How many of ``client``'s requests each worker received."""
        counts = dict.fromkeys(self.engines, 0)
        for engine_id, engine in self.engines.items():
            for req in [*engine.waiting, *engine.running, *engine.finished]:
                if req.client == client:
                    counts[engine_id] += 1
        return counts

    def _sample(self) -> None:
        waiting = [frozenset(r.client for r in e.waiting) for e in self.engines.values()]
        anywhere = frozenset().union(*waiting)
        everywhere = frozenset.intersection(*waiting) if waiting else frozenset()
        served = self.served()
        self.samples.append(ServiceSample(float(self.now), dict(served), anywhere))
        self.samples_all.append(ServiceSample(float(self.now), served, everywhere))


def make_cluster(
    dispatcher: Dispatcher,
    local_policy: Callable[[], LocalPolicy],
    *,
    capacity_tokens: int = 512,
    cache_tokens: int = 1 << 20,
    w_e: float = 1.0,
    w_q: float = 2.0,
    forward_evictions: bool = True,
) -> Cluster:
    """One engine per worker of ``dispatcher``, each with a fresh ``local_policy()``."""
    engines = {
        worker: ClusterEngine(
            policy=local_policy(),
            capacity_tokens=capacity_tokens,
            cache_tokens=cache_tokens,
            w_e=w_e,
            w_q=w_q,
        )
        for worker in dispatcher.workers
    }
    return Cluster(engines, dispatcher, forward_evictions=forward_evictions)


def worker_ids(count: int) -> list[str]:
    return [f"w{i}" for i in range(count)]


def prompt_tokens(
    prefix_id: int, shared_tokens: int, unique_id: int, unique_tokens: int
) -> list[int]:
    """A prompt of ``shared_tokens`` common to every prompt of ``prefix_id`` followed by
    ``unique_tokens`` belonging to ``unique_id`` alone (distinct token ranges, so two
    prompts share exactly the shared part when their prefix ids are equal)."""
    shared = [1_000_000 + prefix_id * 10_000 + k for k in range(shared_tokens)]
    unique = [50_000_000 + unique_id * 1_000 + k for k in range(unique_tokens)]
    return shared + unique


@dataclass(frozen=True)
class ClientLoad:
    """An open-loop client: ``per_step`` requests every ``every`` steps from ``start``."""

    name: str
    per_step: int
    every: int = 1
    shared_tokens: int = 0
    unique_tokens: int = 8
    output_tokens: int = 4
    start: int = 0


def open_loop(loads: Sequence[ClientLoad], steps: int) -> dict[int, list[Request]]:
    """Arrivals (step → requests) of ``loads`` over ``steps`` steps, deterministic.

    Clients are interleaved within a step. Every client uses its own prefix id, so only a
    client's own requests share a prefix; unique tails are numbered globally."""
    arrivals: dict[int, list[Request]] = {}
    serial = 0
    for step in range(steps):
        for client_index, load in enumerate(loads):
            if step < load.start or (step - load.start) % load.every:
                continue
            for _ in range(load.per_step):
                tokens = prompt_tokens(client_index, load.shared_tokens, serial, load.unique_tokens)
                req = make_request(
                    f"{load.name}-{serial}",
                    load.name,
                    tokens,
                    load.output_tokens,
                    output_len=load.output_tokens,
                )
                arrivals.setdefault(step, []).append(req)
                serial += 1
    return arrivals
