"""``fairserve tune weight`` (and the quantum) through the router reach the policy inside
SGLang: the router pushes to the plugin's extension on its side port, the scheduler's next
iteration applies the change. A stock upstream stands in for SGLang's own HTTP server."""

from __future__ import annotations

from tests.api.servers import sglang_extension
from tests.router.helpers import get_json, routed
from tests.router.stock import StockUpstream
from tests.worker.helpers import run

TOKEN = "t"


def test_router_weight_and_quantum_writes_reach_the_sglang_policy() -> None:
    async def body() -> None:
        stock = StockUpstream()
        stock_url = await stock.start()
        try:
            with sglang_extension(TOKEN, 100.0) as (extension_url, host):
                extensions = {stock_url: extension_url}
                async with routed([stock_url], extension_urls=extensions, admin_token=TOKEN) as (
                    _,
                    session,
                ):
                    _, state = await get_json(session, "/fairserve/v1/state")
                    assert state["workers"][0]["fairness"] == "inside"
                    auth = {"Authorization": f"Bearer {TOKEN}"}
                    change = {"client": "team-a", "weight": 3}
                    put = session.put("/fairserve/v1/weights", json=change, headers=auth)
                    async with put as resp:
                        assert resp.status == 200, await resp.text()
                        answer = await resp.json()
                    assert host.policy.weight("team-a") == 3.0, answer
                    put = session.put("/fairserve/v1/quantum", json={"quantum": 321}, headers=auth)
                    async with put as resp:
                        assert resp.status == 200, await resp.text()
                    assert host.policy.quantum == 321
        finally:
            await stock.stop()

    run(body())
