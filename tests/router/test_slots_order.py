"""Worker slots without I/O: who may go to a full worker, and who gets a freed slot."""

from __future__ import annotations

import asyncio

from fairserve.core.types import Request
from fairserve.router.lifecycle import Call
from fairserve.router.slots import WorkerSlots
from tests.worker.helpers import run

W = "http://w:1"


def _call(client: str) -> Call:
    req = Request(id=f"{client}-r", client=client, prompt_key=b"abcd", max_output_tokens=4)
    return Call("chat", client, req, b"{}", False, False, 1.0, 0.0)


def _fill(slots: WorkerSlots, client: str, count: int) -> list[Call]:
    calls = [_call(client) for _ in range(count)]
    for call in calls:
        slots.dispatched(call, W)
    return calls


def test_a_full_worker_takes_only_clients_below_their_share() -> None:
    slots = WorkerSlots(lambda _: 4)
    assert slots.open_for("a", [W]) == [W]
    _fill(slots, "a", 3)
    _fill(slots, "b", 1)
    # Full (4 of 4): a holds 3 of the 4 shared by 2 clients, b 1; c would be the third.
    assert slots.open_for("a", [W]) == []
    assert slots.open_for("b", [W]) == [W]
    assert slots.open_for("c", [W]) == [W]
    # No bound reported: never limited.
    assert WorkerSlots(lambda _: None).open_for("a", [W]) == [W]


def test_a_freed_slot_wakes_the_waiting_client_with_the_fewest_in_flight() -> None:
    async def body() -> None:
        slots = WorkerSlots(lambda _: 4)
        heavy = _fill(slots, "heavy", 3)
        _fill(slots, "medium", 1)
        order: list[str] = []

        async def wait(client: str) -> None:
            await slots.wait(client, 5.0)
            order.append(client)

        waiters = [asyncio.create_task(wait(c)) for c in ("heavy", "medium")]
        await asyncio.sleep(0.01)
        assert sorted(slots.waiting) == ["heavy", "medium"]
        slots.released(heavy[0], W, None)  # heavy waited first, but has 2 in flight to 1
        await asyncio.sleep(0.01)
        assert order == ["medium"]
        slots.released(heavy[1], W, None)
        await asyncio.gather(*waiters)
        assert order == ["medium", "heavy"] and not slots.waiting
        assert slots.outstanding == {W: 2} and slots.in_flight == {"heavy": 1, "medium": 1}

    run(body())


def test_a_newcomer_over_its_share_does_not_jump_the_queue() -> None:
    async def body() -> None:
        slots = WorkerSlots(lambda _: 4)
        _fill(slots, "a", 2)
        _fill(slots, "b", 1)  # 3 of 4: room for one
        waiting = asyncio.create_task(slots.wait("x", 5.0))
        await asyncio.sleep(0.01)
        # "a" holds its share (2 of 4 between 2 clients): behind the waiting request.
        assert slots.open_for("a", [W]) == []
        assert slots.open_for("a", [W], waited=True) == [W]
        assert slots.open_for("b", [W]) == [W]  # below its share: goes anyway
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert not slots.waiting  # a cancelled wait leaves no trace

    run(body())
