"""A worker whose fairserve extension lives on a side port (SGLang with the plugin): the
router must find it there, treat the worker as fair inside, and send quanta there."""

from __future__ import annotations

import pytest

from fairserve.commands.router import parse_extensions
from fairserve.core.errors import ConfigError
from tests.router.helpers import get_json, routed, router_config, sim_workers
from tests.router.stock import StockUpstream
from tests.worker.helpers import run


def test_extension_on_a_side_port_is_discovered_and_gets_the_quantum() -> None:
    async def body() -> None:
        stock = StockUpstream()
        stock_url = await stock.start()
        try:
            # A simulated worker stands in for the side port: it serves /fairserve/worker/*.
            async with (
                sim_workers(1) as (side,),
                routed([stock_url], extension_urls={stock_url: side.url}, admin_token="t") as (
                    _,
                    session,
                ),
            ):
                _, state = await get_json(session, "/fairserve/v1/state")
                (worker,) = state["workers"]
                assert worker["extension"] is True and worker["fairness"] == "inside"
                assert worker["extension_url"] == side.url
                auth = {"Authorization": "Bearer t"}
                put = session.put("/fairserve/v1/quantum", json={"quantum": 321}, headers=auth)
                async with put as resp:
                    assert resp.status == 200, await resp.text()
                assert side.runtime is not None
                assert side.runtime.engine.policy.quantum == 321
        finally:
            await stock.stop()

    run(body())


def test_without_a_side_port_a_stock_worker_gets_the_router_queue() -> None:
    async def body() -> None:
        stock = StockUpstream()
        stock_url = await stock.start()
        try:
            async with routed([stock_url]) as (_, session):
                _, state = await get_json(session, "/fairserve/v1/state")
                (worker,) = state["workers"]
                assert worker["extension"] is False and worker["fairness"] == "router"
                assert worker["extension_url"] == stock_url
        finally:
            await stock.stop()

    run(body())


def test_extension_mapping_is_checked() -> None:
    assert parse_extensions(["http://a:1/=http://a:2"]) == {"http://a:1": "http://a:2"}
    with pytest.raises(ConfigError, match="WORKER_URL=EXTENSION_URL"):
        parse_extensions(["http://a:1"])
    with pytest.raises(ConfigError, match="not one of the --worker-url"):
        router_config(["http://127.0.0.1:1"], extension_urls={"http://127.0.0.1:2": "http://x:3"})
