"""Service as it is delivered: the router's state shows long generations while they decode,
and fairness is judged over a sliding window, not the whole uptime."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from fairserve.core.ledger import ServiceLedger
from fairserve.router.accounting import RATE_WINDOW_S, Accounting, Usage
from tests.router.helpers import chat, get_json, poll, sim_router
from tests.worker.helpers import run

LONG_TOKENS = 4000
"""Long enough that none of the 8 generations ends while the test looks."""


async def _stream_forever(session: aiohttp.ClientSession, client: str) -> None:
    body = chat(f"write a long story for {client}", stream=True, max_tokens=LONG_TOKENS)
    headers = {"X-Fairserve-Client": client}
    async with session.post("/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        async for _ in resp.content.iter_any():
            pass


def _totals(state: dict[str, Any]) -> tuple[float, float, int, int]:
    clients = state["clients"].values()
    service = sum(c["service"] for c in clients)
    tokens_per_s = state["throughput"]["tokens_per_s"]
    finished = sum(c["finished"] for c in clients)
    worker_output = sum(w["output_tokens"] for w in state["workers"])
    return service, tokens_per_s, finished, worker_output


def test_eight_long_generations_show_in_state_before_any_finishes() -> None:
    async def body() -> None:
        async with sim_router(2, worker={"speed": 4.0}) as (_, session, _):
            tasks = [
                asyncio.create_task(_stream_forever(session, f"team-{i % 4}")) for i in range(8)
            ]
            seen: dict[str, Any] = {}

            async def live() -> bool:
                _, state = await get_json(session, "/fairserve/v1/state")
                seen.update(state)
                service, tokens_per_s, _, worker_output = _totals(state)
                return service > 0 and tokens_per_s > 0 and worker_output > 0

            try:
                await poll(live, timeout_s=20.0, what="live service in the state")
                service, _, finished, _ = _totals(seen)
                assert finished == 0, "the point is to see them before they end"
                assert all(c["in_flight"] > 0 for c in seen["clients"].values())
                assert seen["fairness"]["window_s"] == 60.0 and seen["fairness"]["weighted"]
                assert "service units" in seen["fairness"]["unit"]
                first = service

                async def growing() -> bool:
                    _, state = await get_json(session, "/fairserve/v1/state")
                    return _totals(state)[0] > first

                await poll(growing, timeout_s=20.0, what="service still rising")
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    run(body())


def test_state_window_and_limit_are_checked_and_applied() -> None:
    async def body() -> None:
        async with sim_router(1) as (_, session, _):
            for name in ("a", "b", "c"):
                headers = {"X-Fairserve-Client": name}
                async with session.post("/v1/chat/completions", json=chat(), headers=headers) as r:
                    assert r.status == 200
            status, state = await get_json(session, "/fairserve/v1/state?window_s=5&limit=2")
            assert status == 200
            assert state["fairness"]["window_s"] == 5.0
            assert state["clients_total"] == 3 and state["clients_shown"] == 2
            assert len(state["clients"]) == 2
            for bad in ("window_s=0", "window_s=abc", "window_s=601", "limit=0", "window_s=nan"):
                status, answer = await get_json(session, f"/fairserve/v1/state?{bad}")
                assert status == 400, bad
                assert bad.split("=")[0] in answer["error"]["message"]

    run(body())


# ---------------------------------------------------------------- the window, in units
def _serve_equally(ledger: ServiceLedger, names: list[str], t0: int, t1: int) -> None:
    for t in range(t0, t1):
        for name in names:
            ledger.credit(name, 100.0, float(t) + 0.5)
        ledger.sample(float(t) + 1.0)


def test_a_late_joiner_served_at_the_same_rate_keeps_jain_at_one() -> None:
    ledger = ServiceLedger()
    for name in ("a", "b"):
        ledger.add_client(name, 1.0, 0.0)
        ledger.busy(name, 0.0)
    _serve_equally(ledger, ["a", "b"], 0, 100)
    ledger.add_client("late", 1.0, 100.0)
    ledger.busy("late", 100.0)
    _serve_equally(ledger, ["a", "b", "late"], 100, 110)
    view = ledger.window(60.0, 110.0)
    assert set(view.rates) == {"a", "b", "late"}
    assert view.jain_index == pytest.approx(1.0, abs=0.02)
    assert view.start_s == pytest.approx(50.0)
    # Over the whole uptime the late client would look starved: 1000 against 11000 each.
    whole = [11_000.0, 11_000.0, 1_000.0]
    assert sum(whole) ** 2 / (3 * sum(x * x for x in whole)) < 0.75


def test_a_starved_client_in_the_window_drops_jain() -> None:
    ledger = ServiceLedger()
    for name in ("a", "b"):
        ledger.add_client(name, 1.0, 0.0)
        ledger.busy(name, 0.0)
    _serve_equally(ledger, ["a"], 0, 60)
    view = ledger.window(60.0, 60.0)
    assert view.jain_index == pytest.approx(0.5)
    assert view.service_gap.value == pytest.approx(6000.0, rel=0.05)


def test_weights_divide_rates_and_the_gap() -> None:
    ledger = ServiceLedger()
    ledger.add_client("heavy", 2.0, 0.0)
    ledger.add_client("light", 1.0, 0.0)
    for name in ("heavy", "light"):
        ledger.busy(name, 0.0)
    for t in range(60):
        ledger.credit("heavy", 200.0, t + 0.5)
        ledger.credit("light", 100.0, t + 0.5)
        ledger.sample(t + 1.0)
    view = ledger.window(60.0, 60.0)
    assert view.jain_index == pytest.approx(1.0)
    assert view.service_gap.value < 200.0


def test_history_stays_within_the_longest_window() -> None:
    ledger = ServiceLedger(max_window_s=30.0)
    ledger.add_client("a", 1.0, 0.0)
    ledger.busy("a", 0.0)
    for t in range(1000):
        ledger.credit("a", 1.0, float(t))
        ledger.sample(float(t))
    assert len(ledger.samples) <= 31
    assert len(ledger.clients["a"].points) <= 32


def test_accounting_tracks_a_bounded_number_of_clients() -> None:
    acc = Accounting({}, max_clients=100)
    for i in range(1000):
        acc.arrived(f"c{i}", 0.0, float(i))
        acc.finished(f"c{i}", "w", 0.0, Usage(1, 0, 1), 0.1, None, float(i))
    assert len(acc.clients) == 100 and len(acc.ledger.clients) == 100
    assert acc.forgotten == 900
    assert "c999" in acc.clients and "c0" not in acc.clients


def test_live_credit_is_corrected_by_the_final_usage() -> None:
    acc = Accounting({})
    acc.arrived("a", 0.0, 0.0)
    acc.delivered("a", "w", 10, 0, 1.0)
    acc.delivered("a", "w", 0, 5, 2.0)
    assert acc.clients["a"].service == 10 + 2 * 5
    service = acc.finished("a", "w", 0.0, Usage(12, 4, 6), 3.0, 1.0, 3.0, Usage(10, 0, 5))
    assert service == 12 + 2 * 6
    assert acc.clients["a"].service == service
    assert acc.workers["w"].prompt_tokens == 12 and acc.workers["w"].output_tokens == 6
    assert acc.clients["a"].cached_tokens == 4


def test_a_client_that_was_served_and_left_is_judged_on_its_stay() -> None:
    """Served at the others' rate for 10 s, then gone: not diluted by the idle 50 s."""
    ledger = ServiceLedger()
    for name in ("stays", "leaves"):
        ledger.add_client(name, 1.0, 0.0)
        ledger.busy(name, 0.0)
    _serve_equally(ledger, ["stays", "leaves"], 0, 10)
    ledger.idle("leaves", 10.0)
    _serve_equally(ledger, ["stays"], 10, 60)
    view = ledger.window(60.0, 60.0)
    assert view.rates["leaves"] == pytest.approx(view.rates["stays"], rel=0.06)
    assert view.jain_index == pytest.approx(1.0, abs=0.01)


def test_a_stream_credited_per_token_keeps_two_points_per_sample_interval() -> None:
    ledger = ServiceLedger()
    ledger.add_client("a", 1.0, 0.0)
    ledger.busy("a", 0.0)
    for t in range(10):
        for k in range(1000):  # a fast stream: a credit per token
            ledger.credit("a", 2.0, t + k / 1000)
        ledger.sample(t + 1.0)
    assert len(ledger.clients["a"].points) <= 2 * 10 + 1
    assert ledger.cumulative("a") == 20_000.0
    view = ledger.window(10.0, 10.0)
    assert view.rates["a"] == pytest.approx(2_000.0, rel=0.01)


def test_a_clients_rate_window_stays_bounded_when_nobody_reads_the_state() -> None:
    """Issue 18 (soak memory): one bucket per second was kept until a state read trimmed it."""
    acc = Accounting({})
    acc.arrived("a", 0.0, 0.0)
    for second in range(1000):
        acc.delivered("a", "w", 0, 1, float(second))
    assert len(acc.clients["a"].recent) <= RATE_WINDOW_S + 1
