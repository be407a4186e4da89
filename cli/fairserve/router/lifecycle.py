"""A request's lifecycle in the router, sans I/O: one place that says what happened to it.

Before this module, every exit of the proxy (``_finish``, ``_end``, ``_release``) updated the
dispatcher, the fair queue, the accounting, the metrics and the trace by hand, and each new
exit had to remember all five. Now the proxy only reports what happened, through the
:class:`Lifecycle` methods, and the parts that care subscribe (:class:`Subscriber`)::

    (new) --refuse--> rejected                               (over the client's cap: 429)
      |
    arrive
      v
    arrived --dispatch(worker)--> dispatched --queue--> queued --admit--> dispatched
      ^                              |                    |
      |                            send                 reject --> rejected
      +----- retry (release) -----  v
                                   sent --answer--> answered   (the attempt is released after)
                                    |---fail-----> failed
    any stage not yet ended --abort--> aborted                 (client gone, shutdown)
    arrived (no worker left) --fail--> failed

The router's fair queue belongs to one worker, so a request is queued *after* the
dispatcher picked that worker. Guarantees (tested with Hypothesis over event sequences):
every request that arrived gets exactly one terminal event (``answered``, or ``ended`` with
``failed``, ``aborted`` or ``rejected``); every dispatch is released exactly once; an event
that does not fit the request's stage (an abort after the answer) changes nothing.

Nothing here reads a clock or touches a socket: the caller passes the times, which is what
lets the tests replay any order of events. Subscribers run in the order given, synchronously;
only the methods a subscriber overrides are called (bound once, so an event costs one call
per interested subscriber).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fairserve.core.openai_api import Route
from fairserve.core.types import Request
from fairserve.router.accounting import Usage

NEW = "new"
ARRIVED = "arrived"
DISPATCHED = "dispatched"
QUEUED = "queued"
SENT = "sent"
ANSWERED = "answered"
FAILED = "failed"
ABORTED = "aborted"
REJECTED = "rejected"
TERMINAL = frozenset({ANSWERED, FAILED, ABORTED, REJECTED})
ATTEMPT = frozenset({DISPATCHED, QUEUED, SENT})
"""Stages holding a worker (released exactly once)."""


@dataclass(slots=True, eq=False)
class Call:
    """One client request on its way through the router."""

    route: Route
    client: str
    req: Request
    payload: bytes
    stream: bool
    want_usage: bool
    estimate: float
    start_s: float
    app: str | None = None
    tried: list[str] = field(default_factory=list)
    stage: str = NEW
    worker: str | None = None
    """The worker of the attempt not yet released (None: none held)."""
    sent: bool = False
    """Bytes of the answer reached the client (no retry after that)."""
    posted: bool = False
    """The current attempt's request may have reached its worker."""
    bad_gateway: bool = False
    """The last attempt reached a worker that answered badly (502 if none is left)."""
    broken: str | None = None
    """Why the worker's answer broke off after the client got part of it (no retry then;
    it still counts against the worker)."""
    credited_prompt: int = 0
    """Prompt tokens already credited to the client live (at the first streamed token)."""
    credited_output: int = 0
    """Output tokens already credited live (one per streamed event)."""

    @property
    def ended(self) -> bool:
        """The request had its terminal event."""
        return self.stage in TERMINAL


class Subscriber:
    """What a part of the router hears of requests; override the events you need."""

    def refused(self, client: str) -> None:
        """A request refused before it arrived (the client is over its cap)."""

    def arrived(self, call: Call, now_s: float) -> None:
        """A validated request entered the router."""

    def dispatched(self, call: Call, worker: str) -> None:
        """The dispatcher gave the request to ``worker`` (``call.tried[-1]``)."""

    def queued(self, call: Call, worker: str) -> None:
        """The request waits in ``worker``'s router-side fair queue."""

    def unqueued(self, call: Call, worker: str) -> None:
        """The request left the fair queue (released to the worker, refused or gone)."""

    def progress(self, call: Call, prompt_tokens: int, output_tokens: int, now_s: float) -> None:
        """Tokens of a streamed answer reached the client just now."""

    def answered(
        self, call: Call, usage: Usage, latency_s: float, ttft_s: float | None, now_s: float
    ) -> None:
        """Terminal: the client got its answer (before the last write)."""

    def ended(self, call: Call, outcome: str) -> None:
        """Terminal without usage: ``failed``, ``aborted`` or ``rejected``."""

    def released(self, call: Call, worker: str, usage: Usage | None) -> None:
        """The attempt on ``worker`` is over: with the worker's usage when it finished the
        request, None when it did not (aborted, failed, retried elsewhere)."""

    def judged(self, call: Call, worker: str, fault: str | None, unreachable: bool) -> None:
        """How ``worker`` answered: ``fault`` None for a proper answer (any status)."""

    def retried(self, call: Call, worker: str, reason: str) -> None:
        """The attempt on ``worker`` failed before the client saw a byte; another follows."""


_EVENTS = (
    "refused", "arrived", "dispatched", "queued", "unqueued", "progress", "answered",
    "ended", "released", "judged", "retried",
)  # fmt: skip


def _handlers(subscribers: Iterable[Subscriber], event: str) -> tuple[Callable[..., None], ...]:
    """The bound ``event`` methods of the subscribers that override it."""
    base = getattr(Subscriber, event)
    return tuple(getattr(s, event) for s in subscribers if getattr(type(s), event) is not base)


class Lifecycle:
    """The request state machine of one router and its subscribers."""

    def __init__(self, subscribers: Iterable[Subscriber] = ()) -> None:
        self.subscribers: list[Subscriber] = []
        self._on: dict[str, tuple[Callable[..., None], ...]] = {}
        self._bind()
        for subscriber in subscribers:
            self.subscribe(subscriber)

    def subscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.append(subscriber)
        self._bind()

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.remove(subscriber)
        self._bind()

    def _bind(self) -> None:
        on = {event: _handlers(self.subscribers, event) for event in _EVENTS}
        self._on = on
        self._refused, self._arrived = on["refused"], on["arrived"]
        self._dispatched, self._queued = on["dispatched"], on["queued"]
        self._unqueued, self._progress = on["unqueued"], on["progress"]
        self._answered, self._ended = on["answered"], on["ended"]
        self._released, self._judged = on["released"], on["judged"]
        self._retried = on["retried"]

    # ------------------------------------------------------------------ request
    def refuse(self, client: str) -> None:
        """A request of ``client`` refused at the door (it never arrives)."""
        for handler in self._refused:
            handler(client)

    def arrive(self, call: Call, now_s: float) -> None:
        if call.stage != NEW:
            return
        call.stage = ARRIVED
        for handler in self._arrived:
            handler(call, now_s)

    def dispatch(self, call: Call, worker: str) -> None:
        """The dispatcher chose ``worker`` for the next attempt."""
        if call.stage != ARRIVED:
            return
        call.stage = DISPATCHED
        call.worker = worker
        call.posted = False
        call.tried.append(worker)
        for handler in self._dispatched:
            handler(call, worker)

    def queue(self, call: Call) -> None:
        """The attempt waits in its worker's fair queue."""
        if call.stage != DISPATCHED or call.worker is None:
            return
        call.stage = QUEUED
        for handler in self._queued:
            handler(call, call.worker)

    def admit(self, call: Call) -> None:
        """The attempt left its worker's fair queue: released to the worker."""
        self._unqueue(call)

    def send(self, call: Call) -> None:
        """The attempt's request goes to its worker now (it may reach it)."""
        if call.stage != DISPATCHED:
            return
        call.stage = SENT
        call.posted = True

    def progress(self, call: Call, events: int, now_s: float) -> None:
        """``events`` streamed events reached the client so far: credit the prompt once, at
        the first token, then one output token per event (the final usage corrects both)."""
        if call.stage != SENT:
            return
        prompt = 0 if call.credited_prompt else call.req.input_tokens
        output = max(0, events - call.credited_output)
        if prompt or output:
            call.credited_prompt += prompt
            call.credited_output += output
            for handler in self._progress:
                handler(call, prompt, output, now_s)

    def answer(
        self, call: Call, usage: Usage, latency_s: float, ttft_s: float | None, now_s: float
    ) -> None:
        """Terminal: the answer is the client's (the attempt stays held until released)."""
        if call.stage != SENT:
            return
        call.stage = ANSWERED
        for handler in self._answered:
            handler(call, usage, latency_s, ttft_s, now_s)

    def fail(self, call: Call) -> None:
        """Terminal: no worker left to try, or the worker's answer failed after the client
        got part of it, or a worker's error answer was relayed."""
        if call.stage not in TERMINAL:
            self._end(call, FAILED)

    def reject(self, call: Call) -> None:
        """Terminal: the fair queue refused the request (e.g. a rate limit)."""
        self._end(call, REJECTED)

    def abort(self, call: Call) -> None:
        """Terminal unless the request already ended: the client left, or the router stops."""
        if call.stage not in TERMINAL:  # the common case: it ended (one check, no call)
            self._end(call, ABORTED)

    # ------------------------------------------------------------------ attempt
    def release(self, call: Call, usage: Usage | None) -> None:
        """The attempt is over (once; later calls change nothing)."""
        worker = call.worker
        if worker is None:
            return
        if call.stage == QUEUED:
            self._unqueue(call)
        call.worker = None
        if call.stage in ATTEMPT:
            call.stage = ARRIVED
        for handler in self._released:
            handler(call, worker, usage)

    def judge(self, call: Call, worker: str, fault: str | None, unreachable: bool = False) -> None:
        """The verdict on ``worker``'s answer (outlier detection, failure counts)."""
        if worker not in call.tried:
            return
        for handler in self._judged:
            handler(call, worker, fault, unreachable)

    def retry(self, call: Call, worker: str, reason: str, unreachable: bool) -> None:
        """The attempt on ``worker`` failed before the client saw anything: release it if
        it is not yet, hold the failure against the worker, and let the request be
        dispatched again."""
        if worker not in call.tried:
            return
        if call.worker == worker:
            self.release(call, None)
        call.bad_gateway = not unreachable
        if call.stage == ARRIVED:
            for handler in self._retried:
                handler(call, worker, reason)
        self.judge(call, worker, reason, unreachable)

    # ------------------------------------------------------------------ internals
    def _unqueue(self, call: Call) -> None:
        if call.stage != QUEUED or call.worker is None:
            return
        call.stage = DISPATCHED
        for handler in self._unqueued:
            handler(call, call.worker)

    def _end(self, call: Call, outcome: str) -> None:
        if call.stage in TERMINAL or call.stage == NEW:
            return
        if call.stage == QUEUED:  # a request that ends leaves its queue first
            self._unqueue(call)
        call.stage = outcome
        for handler in self._ended:
            handler(call, outcome)


def subscribers_of(lifecycle: Lifecycle, event: str) -> tuple[Any, ...]:
    """The handlers bound for ``event`` (tests, diagnostics)."""
    return lifecycle._on[event]
