"""The router's subscribers to the request lifecycle (:mod:`~fairserve.router.lifecycle`).

Each part of the router that counts or holds something per request hears the lifecycle's
events here and nowhere else: the ledger (:class:`LedgerFeed`), the workers' dispatcher,
fair queues and in-flight counts with their health verdicts (:class:`WorkerFeed`) and the
workload trace (:class:`TraceFeed`). The Prometheus counters are the ledger's, read at scrape
time (:mod:`~fairserve.router.metrics`).
"""

from __future__ import annotations

from typing import Protocol

from fairserve.core.types import Request
from fairserve.router.accounting import NO_USAGE, Accounting, Usage
from fairserve.router.fairqueue import FairQueue
from fairserve.router.lifecycle import Call, Subscriber
from fairserve.router.upstream import Upstream
from fairserve.sched.dispatch.base import Dispatcher
from fairserve.sched.dispatch.cache_model import CacheModel
from fairserve.workloads.trace import TraceWriter


class Workers(Protocol):
    """What the worker feed reads of the router. A protocol, not the ``Router`` itself: the
    router builds its feeds, so importing it here would close an import circle."""

    dispatcher: Dispatcher
    upstreams: dict[str, Upstream]

    def bound_tree(self, worker: str) -> None: ...

    def answer_failed(self, worker: str, reason: str, unreachable: bool) -> None: ...


def cached_in_key_units(req: Request, usage: Usage) -> int:
    """The worker's cache hits in the router's key units (what the dispatcher's and the fair
    queue's charges count). A token-id prompt is counted alike on both sides; a text prompt's
    units are the router's estimates (:mod:`fairserve.core.prefix_key`) while the worker
    counts its real tokens, so the fraction of the prompt it found cached carries over (a
    difference of the two counts would bill a full hit as a partial miss)."""
    units, counted = req.input_tokens, usage.prompt_tokens
    if counted == units:
        return min(usage.cached_tokens, units)
    if counted <= 0:
        return 0
    return min(units, round(units * usage.cached_tokens / counted))


def share_cache(cache: CacheModel, queue: FairQueue | None, worker: str) -> None:
    """Make ``worker``'s fair queue (if any) read and record ``cache``, the dispatcher's
    model, and tell the model whether a queue records ``worker``'s prompts at release.
    Asked at every dispatch: the router gives a worker a queue, or takes it away, when the
    worker comes (back) up."""
    if queue is not None and queue.cache is not cache:
        queue.attach(cache, worker)
    cache.queue_in_front(worker, queue is not None)


class LedgerFeed(Subscriber):
    """Per-client and per-worker bookkeeping (:class:`~fairserve.router.accounting.Accounting`)."""

    def __init__(self, accounting: Accounting) -> None:
        self.accounting = accounting

    def refused(self, client: str) -> None:
        self.accounting.rejected(client)

    def arrived(self, call: Call, now_s: float) -> None:
        acc = self.accounting
        if call.estimate > acc.max_request_cost:
            acc.max_request_cost = call.estimate
        acc.arrived(call.client, call.estimate, now_s)

    def dispatched(self, call: Call, worker: str) -> None:
        acc = self.accounting
        stats = acc.workers.get(worker) or acc.worker(worker)
        stats.requests += 1
        if len(call.tried) > 1:
            stats.retried += 1

    def queued(self, call: Call, worker: str) -> None:
        self.accounting.client(call.client).queued += 1

    def unqueued(self, call: Call, worker: str) -> None:
        self.accounting.client(call.client).queued -= 1

    def progress(self, call: Call, prompt_tokens: int, output_tokens: int, now_s: float) -> None:
        self.accounting.delivered(call.client, call.tried[-1], prompt_tokens, output_tokens, now_s)

    def answered(
        self, call: Call, usage: Usage, latency_s: float, ttft_s: float | None, now_s: float
    ) -> None:
        credited = (
            Usage(call.credited_prompt, 0, call.credited_output)
            if call.credited_prompt or call.credited_output
            else NO_USAGE
        )
        self.accounting.finished(
            call.client, call.tried[-1], call.estimate, usage, latency_s, ttft_s, now_s, credited
        )

    def ended(self, call: Call, outcome: str) -> None:
        self.accounting.ended(call.client, call.estimate, outcome)

    def judged(self, call: Call, worker: str, fault: str | None, unreachable: bool) -> None:
        if fault is not None:
            self.accounting.worker(worker).failures += 1


class WorkerFeed(Subscriber):
    """The worker side: the dispatcher's loads, the fleet's cache model, the worker's fair
    queue, its in-flight count and passive outlier detection (the router's
    ``answer_failed``).

    One cache model per fleet: the dispatcher's (``dispatcher.prefixes``, which the worker's
    eviction feed already prunes) is handed to each worker's fair queue at the worker's
    dispatches, so both read the same prompts, evictions and bound. A worker with a queue
    has its prompts recorded when the queue releases them, not at dispatch
    (:mod:`~fairserve.sched.dispatch.cache_model`).

    Reads ``router.dispatcher`` at each event: a test may wrap the dispatcher."""

    def __init__(self, router: Workers) -> None:
        self.router = router

    def dispatched(self, call: Call, worker: str) -> None:
        router = self.router
        dispatcher, up = router.dispatcher, router.upstreams[worker]
        share_cache(dispatcher.prefixes, up.queue, worker)
        dispatcher.on_dispatch(call.req, worker)
        router.bound_tree(worker)
        up.in_flight += 1

    def released(self, call: Call, worker: str, usage: Usage | None) -> None:
        router = self.router
        req, up = call.req, router.upstreams[worker]
        up.in_flight -= 1
        if usage is not None:
            req.cached_tokens = cached_in_key_units(req, usage)
            req.output_tokens = usage.completion_tokens
            router.dispatcher.on_finish(req, worker, usage.completion_tokens)
            if up.queue is not None:
                up.queue.finish(req, usage.completion_tokens, req.cached_tokens)
        else:
            router.dispatcher.on_abort(req, worker)
            if up.queue is not None:
                up.queue.abort(req)

    def judged(self, call: Call, worker: str, fault: str | None, unreachable: bool) -> None:
        if fault is None:
            up = self.router.upstreams[worker]
            up.failed_answers = 0
            up.outlier_ejections = 0
        else:
            self.router.answer_failed(worker, fault, unreachable)


class TraceFeed(Subscriber):
    """``--trace``: every answered request as a workload trace line."""

    def __init__(self, writer: TraceWriter, started_s: float) -> None:
        self.writer = writer
        self.started_s = started_s

    def answered(
        self, call: Call, usage: Usage, latency_s: float, ttft_s: float | None, now_s: float
    ) -> None:
        self.writer.write(
            call.client,
            call.app,
            call.start_s - self.started_s,
            call.req.prompt_key,
            usage.completion_tokens,
            call.req.max_output_tokens,
        )
