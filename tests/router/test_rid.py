"""Request ids nobody else can name (issue 18): a client that knows or predicts another
tenant's rid can neither abort nor block that tenant's request, and the answers' ids do not
reveal a sequence to predict from.

The attack, as reported: a client sends requests carrying another tenant's rid and resets
each connection; the router then sent ``/abort_request {rid}`` to the worker, ending the
victim's stream. Pre-booking a victim's next rid made the victim's request fail with 400
"rid ... is in flight". Every test runs a real router in front of real simulated workers.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

import aiohttp
import pytest

from tests.router.helpers import chat, get_json, poll, post, sim_router
from tests.worker.helpers import run

VICTIM = {"X-Fairserve-Client": "victim"}
MALLORY = {"X-Fairserve-Client": "mallory"}
SLOW = {"speed": 2.0}
"""Simulated workers slow enough that a 40-token stream lasts about a second."""


async def _stream_ids(
    session: aiohttp.ClientSession, body: dict[str, Any], headers: dict[str, str]
) -> tuple[asyncio.Future[str], asyncio.Task[str]]:
    """Start a chat stream: a future resolved with its answer id at the first chunk, and a
    task that reads it to the end and returns the last finish_reason (or the error)."""
    first: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def read() -> str:
        reason = "none"
        async with session.post("/v1/chat/completions", json=body, headers=headers) as resp:
            if resp.status != 200:
                text = await resp.text()
                if not first.done():
                    first.set_exception(AssertionError(f"{resp.status}: {text}"))
                return f"status {resp.status}: {text}"
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                data = line.strip().removeprefix(b"data: ")
                if data == b"[DONE]":
                    continue
                event = json.loads(data)
                if "error" in event:
                    return f"error: {event['error']}"
                if not first.done():
                    first.set_result(event["id"])
                for choice in event.get("choices", []):
                    reason = choice.get("finish_reason") or reason
        return reason

    return first, asyncio.create_task(read())


async def _post_and_reset(url: str, body: dict[str, Any], client: str, wait_s: float) -> None:
    """Send a streaming generation request over a raw socket, wait ``wait_s``, then reset
    the connection (RST, not FIN): a client that leaves before its answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"X-Fairserve-Client: {client}\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    writer.write(head.encode() + payload)
    await writer.drain()
    await asyncio.sleep(wait_s)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
    del reader


ATTACK_WAITS_S = (0.0, 0.001, 0.003, 0.005, 0.01, 0.02, 0.04, 0.08)


@pytest.mark.parametrize("lean_front", [True, False], ids=["lean", "aiohttp"])
def test_another_clients_rid_and_a_reset_abort_nothing_of_the_victim(lean_front: bool) -> None:
    async def body() -> None:
        async with sim_router(1, worker=SLOW, lean_front=lean_front) as (server, session, _):
            first, victim = await _stream_ids(session, chat(max_tokens=40, stream=True), VICTIM)
            answer_id = await asyncio.wait_for(first, 5.0)
            rid = answer_id.split("-", 1)[1]  # the worst case: the attacker knows it exactly
            for wait_s in ATTACK_WAITS_S:
                attack = chat(max_tokens=40, stream=True, rid=rid)
                await _post_and_reset(server.url, attack, "mallory", wait_s)
            assert await asyncio.wait_for(victim, 10.0) == "length"
            _, state = await get_json(session, "/fairserve/v1/state")
            assert state["clients"]["victim"]["aborted"] == 0

    run(body())


def test_answer_ids_reveal_no_sequence() -> None:
    """Consecutive answers' ids share no prefix an attacker could extend with a counter."""

    async def body() -> None:
        async with sim_router(1) as (_, session, _):
            ids = []
            for _ in range(4):
                status, answer, _ = await post(
                    session, "/v1/chat/completions", chat(), headers=VICTIM
                )
                assert status == 200, answer
                ids.append(answer["id"])
            hexes = [i.removeprefix("chatcmpl-") for i in ids]
            assert all(len(h) == 32 and int(h, 16) >= 0 for h in hexes), ids
            assert len({h[:8] for h in hexes}) == len(hexes), f"shared prefixes: {ids}"
            assert len({h[-8:] for h in hexes}) == len(hexes), f"shared suffixes: {ids}"

    run(body())


def test_pre_booking_a_predicted_rid_does_not_fail_the_victim() -> None:
    async def body() -> None:
        async with sim_router(1, worker=SLOW) as (_, session, _):
            _, answer, _ = await post(session, "/v1/chat/completions", chat(), headers=MALLORY)
            seen = answer["id"].removeprefix("chatcmpl-")
            # The old scheme: a per-process prefix and a counter; book the next few.
            prefix, counter = seen[:16], int(seen[16:], 16)
            predicted = [f"{prefix}{counter + k:016x}" for k in range(1, 4)]
            booked = [
                await _stream_ids(session, chat(max_tokens=40, stream=True, rid=r), MALLORY)
                for r in [*predicted, "job-1"]
            ]
            await asyncio.gather(*(asyncio.wait_for(f, 5.0) for f, _ in booked))
            status, answer, _ = await post(session, "/v1/chat/completions", chat(), headers=VICTIM)
            assert status == 200, answer
            named = chat(rid="job-1")
            status, answer, _ = await post(session, "/v1/chat/completions", named, headers=VICTIM)
            assert status == 200, answer
            assert [await t for _, t in booked] == ["length"] * len(booked)

    run(body())


def test_a_disconnect_aborts_only_the_request_it_carried() -> None:
    """Two clients use the same rid; one leaves: its upstream request is aborted (the worker
    stops working on it), the other's runs to its end."""

    async def body() -> None:
        async with sim_router(1, worker=SLOW) as (server, session, workers):
            first, stays = await _stream_ids(
                session, chat(max_tokens=40, stream=True, rid="same"), VICTIM
            )
            await asyncio.wait_for(first, 5.0)
            await _post_and_reset(
                server.url, chat(max_tokens=40, stream=True, rid="same"), "mallory", 0.3
            )
            runtime = workers[0].runtime
            assert runtime is not None

            async def only_victim_runs() -> bool:
                clients: dict[str, dict[str, int]] = runtime.state()["clients"]
                running = {c: v["running"] + v["waiting"] for c, v in clients.items()}
                return running.get("mallory", 0) == 0 and running.get("victim", 0) == 1

            await poll(only_victim_runs, 3.0, "mallory's request aborted, the victim's running")
            assert await asyncio.wait_for(stays, 10.0) == "length"
            _, state = await get_json(session, "/fairserve/v1/state")
            assert state["clients"]["mallory"]["aborted"] == 1
            assert state["clients"]["victim"]["finished"] == 1

    run(body())


TENANTS = 10


def test_predicted_rids_and_resets_abort_no_other_tenant() -> None:
    """The reported attack at scale: learn the rid sequence from one's own answer, then
    send requests carrying the next rids (the other tenants') and reset each connection."""

    async def body() -> None:
        async with sim_router(2, worker=SLOW) as (server, session, _):
            _, answer, _ = await post(session, "/v1/chat/completions", chat(), headers=MALLORY)
            seen = answer["id"].removeprefix("chatcmpl-")
            prefix, counter = seen[:16], int(seen[16:], 16)
            victims = [
                await _stream_ids(
                    session, chat(max_tokens=40, stream=True), {"X-Fairserve-Client": f"t-{i}"}
                )
                for i in range(TENANTS)
            ]
            await asyncio.gather(*(asyncio.wait_for(f, 5.0) for f, _ in victims))
            for k in range(1, TENANTS + 3):
                attack = chat(max_tokens=40, stream=True, rid=f"{prefix}{counter + k:016x}")
                for wait_s in ATTACK_WAITS_S[:4]:
                    await _post_and_reset(server.url, attack, "mallory", wait_s)
            reasons = [await asyncio.wait_for(t, 10.0) for _, t in victims]
            aborted = sum(reason != "length" for reason in reasons)
            assert aborted == 0, f"{aborted} of {TENANTS} tenants' streams ended early: {reasons}"

    run(body())
