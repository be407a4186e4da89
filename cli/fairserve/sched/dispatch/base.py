"""The dispatcher interface every multi-worker host drives (DESIGN §2).

* ``choose(req, available)`` picks a worker id among ``available`` (healthy workers; all
  known workers when None). It may update internal counters (DoubleQ refills there).
* ``on_dispatch(req, worker)`` records the dispatch: outstanding counts (``s_w``), charges,
  the global radix tree. ``dispatch`` is ``choose`` followed by ``on_dispatch``.
* ``on_finish(req, worker, output_tokens)`` when the worker finished the request;
  ``on_abort(req, worker)`` when it left without finishing (failure, client gone).
* ``on_evict(worker, prefix_key)`` applies a worker's eviction event to ``prefixes``, the
  fleet's one cache model (:mod:`~fairserve.sched.dispatch.cache_model`), which every
  dispatcher holds (a host's fair queues read it whatever the dispatch).

Workers are plain string ids (their URL in the router, ``w0..wN`` in the simulator).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from fairserve.core.cost import CostModel
from fairserve.core.errors import ConfigError, FairserveError, UnknownNameError
from fairserve.core.types import Request
from fairserve.sched.base import Scheduler
from fairserve.sched.dispatch.cache_model import CacheModel
from fairserve.sched.named import NamedClasses


class NoWorkerAvailable(FairserveError):
    """No healthy worker can take a request; hosts answer 503."""


class Dispatcher(Scheduler):
    """Base class: worker set, outstanding counts and tokens, weights, ``dispatch``."""

    kind = "dispatcher"

    def __init__(
        self,
        workers: Sequence[str] = (),
        *,
        cost: CostModel | None = None,
        weights: Mapping[str, float] | None = None,
        **params: Any,
    ) -> None:
        super().__init__(cost=cost, weights=weights, params=params)
        self.workers: list[str] = []
        self.outstanding: dict[str, int] = {}
        self.outstanding_tokens: dict[str, int] = {}
        self.dispatched: dict[str, int] = {}
        self.prefixes = CacheModel()
        """Which worker caches which prompt prefix (a subclass may build it bounded)."""
        self._init_state()
        for worker in workers:
            self.add_worker(worker)

    # ------------------------------------------------------------ workers
    def add_worker(self, worker: str) -> None:
        if worker in self.outstanding:
            raise ConfigError(f"worker {worker!r} added twice")
        self.workers.append(worker)
        self.outstanding[worker] = 0
        self.outstanding_tokens[worker] = 0
        self.dispatched[worker] = 0
        self._worker_added(worker)

    def remove_worker(self, worker: str) -> None:
        self._known(worker)
        self.workers.remove(worker)
        for table in (self.outstanding, self.outstanding_tokens, self.dispatched):
            del table[worker]
        self.prefixes.forget(worker)
        self._worker_removed(worker)

    # ------------------------------------------------------------ events
    def dispatch(self, req: Request, available: Collection[str] | None = None) -> str:
        worker = self.choose(req, available)
        self.on_dispatch(req, worker)
        return worker

    def choose(self, req: Request, available: Collection[str] | None = None) -> str:
        candidates = self._candidates(available)
        return self._choose(req, candidates)

    def on_dispatch(self, req: Request, worker: str) -> None:
        self._known(worker)
        self.outstanding[worker] += 1
        self.outstanding_tokens[worker] += req.input_tokens + req.expected_output_tokens
        self.dispatched[worker] += 1
        self._dispatched(req, worker)

    def on_finish(self, req: Request, worker: str, output_tokens: int) -> None:
        self._release(req, worker)
        self._finished(req, worker, output_tokens)

    def on_abort(self, req: Request, worker: str) -> None:
        self._release(req, worker)
        self._aborted(req, worker)

    def on_evict(self, worker: str, prefix_key: bytes) -> None:
        """A worker evicted ``prefix_key`` from its cache (``b""``: all of it)."""
        self._known(worker)
        self.prefixes.evicted(worker, prefix_key)

    def snapshot(self, clients: Collection[str] | None = None) -> dict[str, Any]:
        """The dispatcher's state; per-client entries only for ``clients`` when given (a
        router tracks up to 10,000 clients and its state read shows the busiest few)."""
        return {
            "dispatch": self.name,
            "params": self.config.as_dict(),
            "quantum": self.quantum,
            "workers": {
                w: {
                    "outstanding": self.outstanding[w],
                    "outstanding_tokens": self.outstanding_tokens[w],
                    "dispatched": self.dispatched[w],
                    **self._worker_state(w),
                }
                for w in self.workers
            },
            **self._extra_state(clients),
        }

    # ------------------------------------------------------------ hooks
    @abstractmethod
    def _choose(self, req: Request, candidates: list[str]) -> str:
        """Pick one of ``candidates`` (non-empty, in worker order)."""

    def _init_state(self) -> None:
        """Set up subclass state; runs after ``self.config`` is resolved, before workers are added
        (``_worker_added`` may need it), so subclasses need no constructor of their own."""

    def _dispatched(self, req: Request, worker: str) -> None: ...

    def _finished(self, req: Request, worker: str, output_tokens: int) -> None: ...

    def _aborted(self, req: Request, worker: str) -> None: ...

    def _worker_added(self, worker: str) -> None: ...

    def _worker_removed(self, worker: str) -> None: ...

    def _worker_state(self, worker: str) -> dict[str, Any]:
        return {}

    def _extra_state(self, clients: Collection[str] | None) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------ helpers
    def least_outstanding(self, candidates: Sequence[str]) -> str:
        """Worker with the fewest outstanding requests; ties go to the first candidate
        (candidates are kept in worker order, and ``min`` keeps the first of equal keys)."""
        return min(candidates, key=self.outstanding.__getitem__)

    def _candidates(self, available: Collection[str] | None) -> list[str]:
        workers = self.workers
        if available is None or available == workers:  # every worker (a router's usual)
            candidates = list(workers)
        else:
            allowed = set(available)
            for worker in allowed:
                self._known(worker)
            candidates = [w for w in self.workers if w in allowed]
        if not candidates:
            raise NoWorkerAvailable("no healthy worker is available")
        return candidates

    def _known(self, worker: str) -> None:
        if worker not in self.outstanding:
            raise UnknownNameError("worker", worker, self.workers)

    def _release(self, req: Request, worker: str) -> None:
        self._known(worker)
        if self.outstanding[worker] <= 0:
            raise ConfigError(f"worker {worker!r} has no outstanding request to release")
        self.outstanding[worker] -= 1
        tokens = req.input_tokens + req.expected_output_tokens
        self.outstanding_tokens[worker] = max(0, self.outstanding_tokens[worker] - tokens)


def shown_clients(known: Collection[str], clients: Collection[str] | None) -> list[str]:
    """The clients a snapshot lists, sorted: all ``known`` ones, or those of ``clients``
    that are known (without walking every known client)."""
    if clients is None:
        return sorted(known)
    return sorted(c for c in clients if c in known)


_DISPATCHERS: NamedClasses[type[Dispatcher]] = NamedClasses("dispatcher")

register_dispatcher = _DISPATCHERS.register
"""Class decorator: make a dispatcher available by its ``name``."""
dispatcher_class = _DISPATCHERS.lookup
dispatcher_names = _DISPATCHERS.names
