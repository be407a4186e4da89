"""Live changes sent over HTTP reach the policy inside SGLang's real scheduler loop: the
extension (served by the leader's ``_poll_timeout_aborts`` hook) queues the change, the
leader's aborts carry it, and ``process_input_requests`` applies it on every rank before the
iteration's requests. Also end to end: ``fairserve tune weight`` through a router."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.sglang_real.real import require_sglang

require_sglang()

from fairserve.sglang import hooks  # noqa: E402
from fairserve.sglang.control import PolicyChange  # noqa: E402
from tests.router.helpers import routed  # noqa: E402
from tests.router.stock import StockUpstream  # noqa: E402
from tests.sglang_real.harness import Engine, set_policy  # noqa: E402

TOKEN = "tier-token"


def put(url: str, body: dict[str, Any], token: str | None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers=headers, method="PUT"
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("timed out")


def serving_engine() -> tuple[Engine, str]:
    set_policy("dlpm", 100.0, extension=True, admin_token=TOKEN)
    engine = Engine(kv_tokens=600)
    engine.add("r0", range(100, 140), 4, "team-a")
    engine.step()  # the leader's first poll starts the extension
    server = hooks.PLUGIN.server
    assert server is not None
    return engine, server.url


def change_through_one_iteration(
    engine: Engine, url: str, body: dict[str, Any], changed: Callable[[], bool]
) -> tuple[int, Any]:
    """PUT in a client thread; then one iteration by hand: the poll carries the change, the
    policy is unchanged until ``process_input_requests`` ran."""
    answer: list[tuple[int, Any]] = []
    client = threading.Thread(target=lambda: answer.append(put(url, body, TOKEN)), daemon=True)
    host = engine.host
    assert host is not None
    client.start()
    wait_for(lambda: bool(host.controls.pending()))
    carried = engine.scheduler._poll_timeout_aborts()
    assert [type(m) for m in carried] == [PolicyChange]
    assert not changed()
    engine.scheduler.process_input_requests(carried)
    assert changed()
    client.join(timeout=15)
    assert answer
    return answer[0]


def test_a_quantum_and_a_weight_over_http_reach_the_policy() -> None:
    engine, url = serving_engine()
    host = engine.host
    assert host is not None
    status, body = change_through_one_iteration(
        engine, url + "/fairserve/worker/quantum", {"quantum": 250},
        lambda: host.policy.quantum == 250,
    )  # fmt: skip
    assert (status, body) == (200, {"policy": "dlpm", "quantum": 250.0})
    status, body = change_through_one_iteration(
        engine, url + "/fairserve/worker/weights", {"client": "team-a", "weight": 3},
        lambda: host.policy.weight("team-a") == 3.0,
    )  # fmt: skip
    assert status == 200 and body["weights"] == {"team-a": 3.0}
    status, body = put(url + "/fairserve/worker/quantum", {"quantum": 50}, "wrong")
    assert status == 403 and host.policy.quantum == 250
    engine.run(10)
    assert engine.idle() and host.state_json()["engine"]["finished"] == 1


def test_fairserve_tune_weight_reaches_the_policy_inside_sglang() -> None:
    """The CLI talks to a router; the router pushes to the plugin's extension; the
    scheduler's loop (its own thread, as SGLang's scheduler process) applies it."""
    engine, extension_url = serving_engine()
    host = engine.host
    assert host is not None
    stop = threading.Event()

    def scheduler_loop() -> None:
        for _ in range(20_000):  # bounded: about 100 s at most
            if stop.wait(0.005):
                return
            engine.step()

    loop = threading.Thread(target=scheduler_loop, name="scheduler", daemon=True)

    async def body() -> None:
        stock = StockUpstream()  # stands in for SGLang's own HTTP server
        stock_url = await stock.start()
        try:
            async with routed(
                [stock_url], extension_urls={stock_url: extension_url}, admin_token=TOKEN
            ) as (server, _session):
                cli = await asyncio.create_subprocess_exec(
                    str(Path(sys.executable).with_name("fairserve")), "tune", "weight",
                    "team-b", "2.5", "--create", "--json", "--url", server.url,
                    "--token", TOKEN,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                )  # fmt: skip
                out, err = await asyncio.wait_for(cli.communicate(), timeout=60)
                assert cli.returncode == 0, (out, err)
        finally:
            await stock.stop()

    loop.start()
    try:
        asyncio.run(asyncio.wait_for(body(), timeout=90))
    finally:
        stop.set()
        loop.join(timeout=10)
    assert host.policy.weight("team-b") == 2.5
