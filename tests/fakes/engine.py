"""A small deterministic step engine for policy tests (not the simulator of DESIGN §3).

It drives a real local policy through the event contract of
``fairserve.sched.local.base``: arrivals, ``select`` with a memory check, admissions charged
by extend tokens from a real radix prefix cache, one decoded token per running request per
step, finishes. Time is the step index. It records, after every step, each client's
cumulative service *as processed* (``w_e``·extend + ``w_q``·decoded, independent of the
policy's own counters) and which clients had waiting requests, in the
:class:`~fairserve.core.metrics.ServiceSample` form the fairness metrics read.

Memory model: a running request holds ``input + output_len`` tokens of ``capacity_tokens``
(reserved at admission, like a max-tokens reservation); the prefix cache is a separate LRU
tree of ``cache_tokens`` that only decides how many prompt tokens are recomputed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from fairserve.core.errors import RequestRejected
from fairserve.core.metrics import ServiceSample
from fairserve.core.radix import RadixTree
from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy


@dataclass
class StepEngine:
    """One worker: a waiting queue, a running batch, a prefix cache, a local policy."""

    policy: LocalPolicy
    capacity_tokens: int = 4096
    cache_tokens: int = 1 << 20
    max_batch_requests: int | None = None
    w_e: float = 1.0
    w_q: float = 2.0
    now: int = 0
    waiting: list[Request] = field(default_factory=list)
    running: list[Request] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    rejected: list[tuple[Request, RequestRejected]] = field(default_factory=list)
    samples: list[ServiceSample] = field(default_factory=list)
    served: dict[str, float] = field(default_factory=dict)
    extend_total: int = 0
    decoded_total: int = 0
    idle_with_fitting_work: int = 0

    def __post_init__(self) -> None:
        self.tree = RadixTree()
        self.reserved = 0

    # -------------------------------------------------------------- driving
    def submit(self, req: Request) -> None:
        """A request arrives now."""
        req.arrival_s = float(self.now)
        try:
            self.policy.on_arrival(req, float(self.now))
        except RequestRejected as exc:
            self.rejected.append((req, exc))
            return
        self.waiting.append(req)
        self.served.setdefault(req.client, 0.0)

    def step(self) -> list[Request]:
        """One batching step + one decode step; returns the requests admitted."""
        admitted = self._admit()
        self._check_work_conserving()
        self._decode()
        self.now += 1
        self._sample()
        return admitted

    def run(self, arrivals: dict[int, list[Request]], max_steps: int) -> None:
        """Feed ``arrivals`` (step → requests) and step until idle or ``max_steps``."""
        for _ in range(max_steps):
            for req in arrivals.get(self.now, []):
                self.submit(req)
            if not self.waiting and not self.running and self.now > max(arrivals, default=0):
                break
            self.step()

    # -------------------------------------------------------------- internals
    def need_tokens(self, req: Request) -> int:
        return req.input_tokens + req.expected_output_tokens

    def _fits(self, req: Request) -> bool:
        if self.max_batch_requests is not None and len(self.running) >= self.max_batch_requests:
            return False
        return self.reserved + self.need_tokens(req) <= self.capacity_tokens

    def _admit(self) -> list[Request]:
        def can_fit(req: Request) -> bool:
            if not self._fits(req):
                return False
            self.reserved += self.need_tokens(req)
            self.running.append(req)
            return True

        def match_len(req: Request) -> int:
            return self.tree.match_len(req.prompt_key)

        admitted = self.policy.select(list(self.waiting), can_fit, match_len, float(self.now))
        ids = {id(r) for r in admitted}
        self.waiting = [r for r in self.waiting if id(r) not in ids]
        for req in admitted:
            cached = self.tree.match_len(req.prompt_key)
            req.cached_tokens = cached
            extend = req.input_tokens - cached
            self.policy.correct_extend(req, extend)
            self.tree.insert(req.prompt_key)
            self.extend_total += extend
            self.served[req.client] = self.served.get(req.client, 0.0) + self.w_e * extend
            req.admit_s = float(self.now)
        if self.tree.total_tokens > self.cache_tokens:
            self.tree.evict(self.tree.total_tokens - self.cache_tokens)
        return admitted

    def _check_work_conserving(self) -> None:
        if any(self._fits(r) for r in self.waiting):
            self.idle_with_fitting_work += 1

    def _decode(self) -> None:
        if not self.running:
            return
        for req in self.running:
            req.output_tokens += 1
            self.decoded_total += 1
            self.served[req.client] = self.served.get(req.client, 0.0) + self.w_q
        self.policy.on_decode_step(self.running, float(self.now))
        still: list[Request] = []
        for req in self.running:
            if req.output_tokens >= req.expected_output_tokens:
                req.finish_s = float(self.now + 1)
                self.reserved -= self.need_tokens(req)
                self.policy.on_finish(req, float(self.now + 1))
                self.finished.append(req)
            else:
                still.append(req)
        self.running = still

    def _sample(self) -> None:
        backlogged = frozenset(r.client for r in self.waiting)
        self.samples.append(ServiceSample(float(self.now), dict(self.served), backlogged))


def by_step(requests: Iterable[tuple[int, Request]]) -> dict[int, list[Request]]:
    """Group ``(step, request)`` pairs into the arrivals mapping ``StepEngine.run`` takes."""
    out: dict[int, list[Request]] = {}
    for step, req in requests:
        out.setdefault(step, []).append(req)
    return out
