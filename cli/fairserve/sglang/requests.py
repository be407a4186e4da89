"""SGLang's requests as the scheduling core sees them, and what the plugin tracks of each.

Pure adapters: they read the few fields of SGLang's ``Req`` listed in
:mod:`fairserve.sglang.targets` (duck-typed, so tests use fakes) and never import SGLang.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from fairserve.core.counters import EngineCounts
from fairserve.core.types import ANONYMOUS_CLIENT, Request

UINT32_MASK = 0xFFFFFFFF


class SamplingLike(Protocol):
    max_new_tokens: int | None


class ReqLike(Protocol):
    """The fields of ``sglang.srt.managers.schedule_batch.Req`` the plugin reads."""

    rid: str
    routing_key: str | None
    origin_input_ids: Sequence[int]
    output_ids: Sequence[int]
    full_untruncated_fill_ids: Sequence[int]
    prefix_len: int
    sampling_params: Any
    finished_reason: Any

    def finished(self) -> bool: ...


class State(Enum):
    WAITING = "waiting"
    RUNNING = "running"


@dataclass(slots=True, eq=False)
class Tracked:
    """One request the policy knows: its core view, where it is, the match last read."""

    req: Request
    state: State = State.WAITING
    matched: int | None = None
    """Its prefix match when last read (None: not read since it arrived or came back)."""
    need: int | None = None
    """KV tokens SGLang's adder charges it at least, from that match (None: unknown)."""
    sreq: Any = None
    """The SGLang request, as last seen in the waiting queue."""


def client_of(sreq: ReqLike) -> str:
    """The client is the routing key the router sets (DESIGN §5), else ``anonymous``."""
    key = getattr(sreq, "routing_key", None)
    return key if isinstance(key, str) and key else ANONYMOUS_CLIENT


def prompt_key(token_ids: Sequence[int]) -> bytes:
    """Token ids as a core token key. SGLang's ids are int64 (multimodal placeholders can be
    large hashes); they are folded into uint32, which only the prefix *order* depends on."""
    ids = token_ids.tolist() if isinstance(token_ids, array) else list(token_ids)
    try:
        return array("I", ids).tobytes()
    except OverflowError:
        return array("I", [int(t) & UINT32_MASK for t in ids]).tobytes()


def to_request(sreq: ReqLike, arrival_s: float) -> Request:
    """The core request for an SGLang request arriving at ``arrival_s`` (plugin clock)."""
    max_new = getattr(sreq.sampling_params, "max_new_tokens", None)
    return Request(
        id=str(sreq.rid),
        client=client_of(sreq),
        prompt_key=prompt_key(sreq.origin_input_ids),
        max_output_tokens=max(0, int(max_new)) if max_new is not None else 0,
        arrival_s=arrival_s,
    )


def is_abort(sreq: ReqLike) -> bool:
    """Whether a finished request was aborted (client gone, timeout) rather than completed.
    Matched by the class name of SGLang's finish reason, so SGLang is never imported."""
    return type(sreq.finished_reason).__name__ == "FINISH_ABORT"


def real_extend_tokens(sreq: ReqLike) -> int:
    """Tokens SGLang will compute for an admitted request: everything after its real cached
    prefix (``prefix_len`` after admission, host-cache load-backs included; a retracted
    request also recomputes its outputs)."""
    return max(0, len(sreq.full_untruncated_fill_ids) - int(sreq.prefix_len))


@dataclass
class EngineCounters(EngineCounts):
    """Totals for ``/fairserve/worker/state`` (``engine`` section, as the simulated worker):
    the shared engine counters plus the plugin's own (errors, overlap-aware busy time)."""

    errors: int = 0
    busy_until_s: float = 0.0

    def busy(self, start_s: float, end_s: float) -> None:
        """Add a step's interval to the busy time, counting overlaps once (with SGLang's
        overlap scheduling the next step starts before this one's results are read)."""
        start_s = max(start_s, self.busy_until_s)
        if end_s > start_s:
            self.busy_s += end_s - start_s
        self.busy_until_s = max(self.busy_until_s, end_s)

    def admit(self, input_tokens: int, extend_tokens: int) -> None:
        self.admitted += 1
        self.prompt_tokens += input_tokens
        self.prefill_tokens += extend_tokens
        self.cached_tokens += max(0, input_tokens - extend_tokens)

    def as_json(self) -> dict[str, Any]:
        return {**EngineCounts.as_json(self), "errors": self.errors}


@dataclass
class RequestTable:
    """Requests by SGLang rid, from arrival until finish or abort, and the waiting ones in
    the order the local policies are given them.

    That order is the one DLPM's kept LPM order predicts from the policy's events
    (:mod:`fairserve.sched.local.lpm_index`), and the simulator's: an arrival joins at the
    back, a retracted request at the front, an admission or an abort leaves. SGLang's own
    list cannot give it (its ``calc_priority`` and the plugin's decisions permute it), and
    sorting by arrival number put a retracted request back among the others, a list the
    policy's events do not describe: DLPM then sorted the whole queue again at the next
    decision (issue 23: ~30 ms at 10,000 waiting)."""

    by_rid: dict[str, Tracked] = field(default_factory=dict)
    queue: dict[str, Tracked] = field(default_factory=dict)
    """The waiting requests by rid, front first."""
    unread: dict[str, None] = field(default_factory=dict)
    """Waiting requests whose match was not read since they joined the queue."""
    by_key: dict[Request, Tracked] = field(default_factory=dict)
    """Every request by core request (hashed by identity; what a decision looks up)."""
    sreqs: dict[Any, Tracked] = field(default_factory=dict)
    """The waiting requests by SGLang object (hashed by identity: SGLang's ``Req`` has no
    ``__eq__``): whether SGLang's list holds exactly them is one set comparison in C that
    reads no request's fields."""

    def get(self, rid: object) -> Tracked | None:
        return self.by_rid.get(str(rid))

    def add(self, req: Request, sreq: Any = None) -> Tracked:
        """An arrival: waiting, at the back."""
        tracked = Tracked(req)
        self.by_rid[req.id] = tracked
        self.by_key[req] = tracked
        self.queue[req.id] = tracked
        self.unread[req.id] = None
        self.bind(tracked, sreq)
        return tracked

    def bind(self, tracked: Tracked, sreq: Any) -> None:
        """``sreq`` is the SGLang object of the waiting request ``tracked``."""
        sreqs, old = self.sreqs, tracked.sreq
        try:
            if old is not None and sreqs.get(old) is tracked:
                del sreqs[old]
            if sreq is not None:
                sreqs[sreq] = tracked
        except TypeError:  # an unhashable request type: SGLang's lists are read by rid
            pass
        tracked.sreq = sreq

    def put_back(self, tracked: Tracked, sreq: Any) -> None:
        """A retraction: waiting again, at the front (a new dict: O(waiting) in C, once per
        retracted request)."""
        tracked.state = State.WAITING
        tracked.matched = tracked.need = None
        self.queue = {tracked.req.id: tracked, **self.queue}
        self.unread[tracked.req.id] = None
        self.bind(tracked, sreq)

    def started(self, tracked: Tracked) -> None:
        """An admission: running, out of the waiting order."""
        tracked.state = State.RUNNING
        self.queue.pop(tracked.req.id, None)
        self.bind(tracked, None)

    def forget(self, rid: str) -> None:
        tracked = self.by_rid.pop(rid, None)
        if tracked is None:
            return
        self.queue.pop(rid, None)
        self.by_key.pop(tracked.req, None)
        self.bind(tracked, None)

    def waiting(self) -> list[Tracked]:
        """The waiting requests, front first."""
        return list(self.queue.values())

    def per_client(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        for tracked in self.by_rid.values():
            entry = counts.setdefault(tracked.req.client, {"waiting": 0, "running": 0})
            entry[tracked.state.value] += 1
        return dict(sorted(counts.items()))
