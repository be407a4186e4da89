"""The fair queue's uncontended fast path (issue 23) decides as the full path does, and so
does its decision that a full worker ends.

A request that arrives to an empty queue with a free slot skips the queue's list work and
does not keep its match (:meth:`FairQueue._alone`). Random sequences of arrivals, finishes,
aborts and cancellations run through two queues over the same requests, one with the fast
path and one forced through the full path (the code before the fast path): the releases,
their order, the waiting requests and every field of the local policy's state must be
identical after every step, and so must what the cache model answers for every prompt."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.types import Request, make_request
from fairserve.router.fairqueue import FairQueue
from fairserve.sched.registry import make_local_policy
from tests.worker.helpers import run

POLICIES = ("dlpm", "vtc", "lpm", "fcfs", "lcf", "preble")


class LoggedQueue(FairQueue):
    """A fair queue that logs the ids of the requests it releases, in order."""

    def __init__(self, policy_name: str, max_outstanding: int, clock: _Clock) -> None:
        super().__init__(make_local_policy(policy_name), max_outstanding, 4096, clock)
        self.log: list[str] = []

    def _release(self, req: Request) -> None:
        self.log.append(req.id)
        super()._release(req)


class FullPathQueue(LoggedQueue):
    """The queue as it was before the fast path: every arrival goes through ``_pump``, and
    every waiting request is asked about (``select`` with "a slot is free"), also once the
    worker is full (the queue now ends the decision there: ``test_fairqueue_exhausted.py``)."""

    def _alone(self, req: Request, now: float) -> bool:
        self.policy.on_arrival(req, now)
        self._waiting.append(req)
        self._pump(now)
        return id(req) in self._admitted

    def _decide(self, now: float) -> list[Request]:
        return self.policy.select(self._waiting, self._can_fit, self._match_len, now)


@dataclass
class _Clock:
    now_s: float = 0.0

    def __call__(self) -> float:
        return self.now_s


@dataclass
class _Run:
    """One queue and the tasks of its waiting acquisitions."""

    queue: LoggedQueue
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)


def _plain(value: Any, depth: int = 0) -> Any:
    """A comparable picture of a policy's state: requests by id, objects by their fields."""
    if depth > 8:
        return repr(type(value))
    if isinstance(value, Request):
        return ("request", value.id)
    if isinstance(value, (str, int, float, bool, bytes, Enum)) or value is None:
        return value
    if isinstance(value, dict):
        return {_key(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(repr(_plain(v, depth + 1)) for v in value)
    if is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name), depth + 1) for f in fields(value)}
    if hasattr(value, "__dict__"):
        return {k: _plain(v, depth + 1) for k, v in sorted(vars(value).items())}
    slots = getattr(type(value), "__slots__", ())
    if slots:
        return {s: _plain(getattr(value, s, None), depth + 1) for s in sorted(slots)}
    return repr(value)


def _key(key: Any) -> Any:
    return ("request", key.id) if isinstance(key, Request) else key


def _state(queue: FairQueue, prompts: list[Request]) -> dict[str, Any]:
    return {
        "log": list(queue.log) if isinstance(queue, LoggedQueue) else None,
        "waiting": [r.id for r in queue._waiting],
        "outstanding": queue.outstanding,
        "released": queue.released,
        "policy": _plain(vars(queue.policy)),
        "snapshot": _plain(queue.snapshot()),
        "matches": [queue.cache.walk_len(r.prompt_key, queue.worker) for r in prompts],
    }


_PROMPT_GROUPS = [[1000 + g] * (8 + 8 * g) for g in range(3)]

arrival = st.tuples(
    st.just("arrive"),
    st.sampled_from(["a", "b", "c"]),
    st.integers(0, 2),  # the prompt's group (shared prefix)
    st.integers(1, 40),  # own tokens after the group's prefix
)
finish = st.tuples(st.just("finish"), st.integers(0, 60), st.integers(0, 30), st.integers(0, 100))
abort = st.tuples(st.just("abort"), st.integers(0, 60), st.just(0), st.just(0))
cancel = st.tuples(st.just("cancel"), st.integers(0, 60), st.just(0), st.just(0))
operations = st.lists(st.one_of(arrival, arrival, finish, finish, abort, cancel), max_size=60)


async def _apply(runs: list[_Run], op: tuple[str, Any, int, int], reqs: list[Request]) -> None:
    kind, a, b, c = op
    if kind == "arrive":
        ids = _PROMPT_GROUPS[b] + [5000 + len(reqs)] * c
        req = make_request(f"r{len(reqs)}", a, ids, 8, arrival_s=float(len(reqs)))
        reqs.append(req)
        for one in runs:
            task = asyncio.ensure_future(one.queue.acquire(req))
            one.tasks[req.id] = task
        await asyncio.sleep(0)
        return
    if not reqs:
        return
    req = reqs[a % len(reqs)]
    for one in runs:
        queue = one.queue
        if kind == "finish":
            queue.finish(req, b, min(c, req.input_tokens))
        elif kind == "abort":
            queue.abort(req)
        else:  # the client went away while its request waited (or after its release)
            one.tasks[req.id].cancel()
    await asyncio.sleep(0)


async def _compare(policy: str, max_outstanding: int, ops: list[Any]) -> None:
    clock = _Clock()
    fast = _Run(LoggedQueue(policy, max_outstanding, clock))
    full = _Run(FullPathQueue(policy, max_outstanding, clock))
    reqs: list[Request] = []
    for step, op in enumerate(ops):
        clock.now_s = float(step)
        await _apply([fast, full], op, reqs)
        assert _state(fast.queue, reqs) == _state(full.queue, reqs), (step, op)
    for one in (fast, full):
        for task in one.tasks.values():
            task.cancel()
    await asyncio.sleep(0)


@pytest.mark.parametrize("policy", POLICIES)
@given(max_outstanding=st.integers(1, 3), ops=operations)
def test_the_fast_path_releases_and_charges_as_the_full_path(
    policy: str, max_outstanding: int, ops: list[Any]
) -> None:
    run(_compare(policy, max_outstanding, ops))


def test_a_request_alone_is_released_at_once_without_keeping_its_match() -> None:
    """And a request that finds no slot waits as before, released when one frees up."""

    async def body() -> None:
        clock = _Clock()
        queue = LoggedQueue("dlpm", 1, clock)
        req = make_request("r0", "a", [1, 2, 3], 4)
        await queue.acquire(req)
        assert queue.log == ["r0"] and queue.outstanding == 1
        assert not queue.cache._kept.get(queue.worker)  # the fast path kept no match
        other = make_request("r1", "a", [1, 2, 3, 4], 4)
        task = asyncio.ensure_future(queue.acquire(other))
        await asyncio.sleep(0)
        assert queue.waiting == 1 and queue.log == ["r0"]  # no slot: the full path
        queue.finish(req, 2, 0)
        await task
        assert queue.log == ["r0", "r1"]

    run(body())
