"""The router's request lifecycle (sans I/O): one terminal event per request, one release per
dispatch, whatever order the proxy reports events in."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.types import TOKEN_BYTES, Request
from fairserve.router.accounting import Usage
from fairserve.router.lifecycle import TERMINAL, Call, Lifecycle, Subscriber, subscribers_of

PROMPT_TOKENS = 7
TERMINAL_EVENTS = ("answered", "ended")


class Recorder(Subscriber):
    """Every event, in order, as (name, detail)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def refused(self, client: str) -> None:
        self.events.append(("refused", client))

    def arrived(self, call: Call, now_s: float) -> None:
        self.events.append(("arrived", now_s))

    def dispatched(self, call: Call, worker: str) -> None:
        self.events.append(("dispatched", worker))

    def queued(self, call: Call, worker: str) -> None:
        self.events.append(("queued", worker))

    def unqueued(self, call: Call, worker: str) -> None:
        self.events.append(("unqueued", worker))

    def progress(self, call: Call, prompt_tokens: int, output_tokens: int, now_s: float) -> None:
        self.events.append(("progress", (prompt_tokens, output_tokens)))

    def answered(
        self, call: Call, usage: Usage, latency_s: float, ttft_s: float | None, now_s: float
    ) -> None:
        self.events.append(("answered", usage))

    def ended(self, call: Call, outcome: str) -> None:
        self.events.append(("ended", outcome))

    def released(self, call: Call, worker: str, usage: Usage | None) -> None:
        self.events.append(("released", worker))

    def judged(self, call: Call, worker: str, fault: str | None, unreachable: bool) -> None:
        self.events.append(("judged", fault))

    def retried(self, call: Call, worker: str, reason: str) -> None:
        self.events.append(("retried", worker))

    def names(self) -> list[str]:
        return [name for name, _ in self.events]


def new_call() -> Call:
    key = b"k" * (TOKEN_BYTES * PROMPT_TOKENS)
    req = Request(id="r1", client="a", prompt_key=key, max_output_tokens=4)
    return Call(
        route="completions",
        client="a",
        req=req,
        payload=b"{}",
        stream=True,
        want_usage=False,
        estimate=1.0,
        start_s=0.0,
    )


def fresh() -> tuple[Lifecycle, Recorder, Call]:
    recorder = Recorder()
    return Lifecycle([recorder]), recorder, new_call()


USAGE = Usage(PROMPT_TOKENS, 0, 3)
WORKERS = st.sampled_from(["w0", "w1"])
ACTIONS = st.one_of(
    st.tuples(st.just("dispatch"), WORKERS),
    st.tuples(st.just("queue")),
    st.tuples(st.just("admit")),
    st.tuples(st.just("send")),
    st.tuples(st.just("progress"), st.integers(0, 5)),
    st.tuples(st.just("answer")),
    st.tuples(st.just("fail")),
    st.tuples(st.just("reject")),
    st.tuples(st.just("abort")),
    st.tuples(st.just("release"), st.booleans()),
    st.tuples(st.just("retry"), WORKERS, st.booleans()),
    st.tuples(st.just("judge"), WORKERS),
)


def apply(life: Lifecycle, call: Call, action: tuple[Any, ...]) -> None:
    name, *args = action
    if name == "dispatch":
        life.dispatch(call, args[0])
    elif name in ("queue", "admit", "send", "fail", "reject", "abort"):
        getattr(life, name)(call)
    elif name == "progress":
        life.progress(call, args[0], 1.0)
    elif name == "answer":
        life.answer(call, USAGE, 1.0, 0.5, 1.0)
    elif name == "release":
        life.release(call, USAGE if args[0] else None)
    elif name == "retry":
        life.retry(call, args[0], "refused", args[1])
    else:
        life.judge(call, args[0], None)


def replay(actions: list[Any], arrive: bool = True) -> tuple[Lifecycle, Recorder, Call]:
    """A request (arrived or not) after ``actions``, in order."""
    life, rec, call = fresh()
    if arrive:
        life.arrive(call, 0.0)
    for action in actions:
        apply(life, call, action)
    return life, rec, call


@given(st.lists(ACTIONS, max_size=30))
def test_any_sequence_ends_once_and_releases_every_dispatch(actions: list[Any]) -> None:
    life, rec, call = replay(actions)
    # What the proxy's ``finally`` clauses do, whatever happened before.
    life.release(call, None)
    life.abort(call)
    names = rec.names()
    assert sum(names.count(e) for e in TERMINAL_EVENTS) == 1, names
    assert call.stage in TERMINAL and call.worker is None
    assert names.count("dispatched") == names.count("released") == len(call.tried)
    assert names.count("queued") == names.count("unqueued")
    end = next(i for i, n in enumerate(names) if n in TERMINAL_EVENTS)
    assert not {"dispatched", "queued", "progress", "retried"} & set(names[end:]), names
    assert call.credited_prompt in (0, PROMPT_TOKENS)


@given(st.lists(ACTIONS, max_size=30))
def test_a_request_that_never_arrived_has_no_events(actions: list[Any]) -> None:
    life, rec, call = replay(actions, arrive=False)
    life.abort(call)
    assert rec.events == [] and call.stage == "new"


@given(st.lists(ACTIONS, max_size=30))
def test_attempts_alternate_dispatch_and_release(actions: list[Any]) -> None:
    _, rec, _ = replay(actions)
    held = 0
    for name in rec.names():
        held += {"dispatched": 1, "released": -1}.get(name, 0)
        assert held in (0, 1)


def test_answered_path() -> None:
    life, rec, call = fresh()
    life.arrive(call, 0.0)
    life.dispatch(call, "w0")
    life.send(call)
    life.progress(call, 1, 0.5)
    life.progress(call, 3, 0.6)
    life.answer(call, USAGE, 1.0, 0.5, 1.0)
    life.release(call, USAGE)
    life.judge(call, "w0", None)
    life.abort(call)
    assert rec.events == [
        ("arrived", 0.0),
        ("dispatched", "w0"),
        ("progress", (PROMPT_TOKENS, 1)),
        ("progress", (0, 2)),
        ("answered", USAGE),
        ("released", "w0"),
        ("judged", None),
    ]


def test_retried_elsewhere_then_no_worker_left() -> None:
    life, rec, call = fresh()
    life.arrive(call, 0.0)
    life.dispatch(call, "w0")
    life.send(call)
    life.release(call, None)  # the attempt's ``finally``
    life.retry(call, "w0", "answered 500", unreachable=False)
    life.dispatch(call, "w1")
    life.send(call)
    life.release(call, None)
    life.retry(call, "w1", "refused", unreachable=True)
    life.fail(call)  # no worker left
    life.abort(call)
    assert rec.names() == [
        "arrived", "dispatched", "released", "retried", "judged",
        "dispatched", "released", "retried", "judged", "ended",
    ]  # fmt: skip
    assert rec.events[-1] == ("ended", "failed")
    assert call.tried == ["w0", "w1"] and call.bad_gateway is False


def test_queue_rejection_and_leaving_the_queue() -> None:
    life, rec, call = fresh()
    life.arrive(call, 0.0)
    life.dispatch(call, "w0")
    life.queue(call)
    life.reject(call)
    life.admit(call)  # the ``finally`` of the wait: already out
    life.release(call, None)
    life.abort(call)
    assert rec.names() == ["arrived", "dispatched", "queued", "unqueued", "ended", "released"]
    assert rec.events[-2] == ("ended", "rejected")

    life, rec, call = fresh()
    life.arrive(call, 0.0)
    life.dispatch(call, "w0")
    life.queue(call)
    life.admit(call)  # cancelled while waiting: the wait's ``finally``
    life.release(call, None)
    life.abort(call)
    assert rec.names() == ["arrived", "dispatched", "queued", "unqueued", "released", "ended"]
    assert rec.events[-1] == ("ended", "aborted")


def test_refused_is_its_own_event() -> None:
    life, rec, _ = fresh()
    life.refuse("a")
    assert rec.events == [("refused", "a")]


def test_only_overridden_events_are_bound() -> None:
    class OnlyEnded(Subscriber):
        def ended(self, call: Call, outcome: str) -> None:
            pass

    life = Lifecycle([OnlyEnded(), Recorder()])
    assert len(subscribers_of(life, "ended")) == 2
    assert len(subscribers_of(life, "arrived")) == 1
