"""The foreground launch's live view shows traffic as it flows, read from a real router."""

from __future__ import annotations

from typing import Any

from fairserve.cluster.view import traffic_line, worker_traffic
from tests.router.helpers import chat, get_json, post, sim_router
from tests.worker.helpers import run


def test_the_live_line_and_rows_change_with_traffic() -> None:
    async def body() -> tuple[dict[str, Any], dict[str, Any]]:
        async with sim_router(2) as (_, session, _):
            _, before = await get_json(session, "/fairserve/v1/state")
            for i in range(6):
                headers = {"X-Fairserve-Client": f"team-{i % 2}"}
                status, _, _ = await post(
                    session, "/v1/chat/completions", chat(f"q{i}"), headers=headers
                )
                assert status == 200
            _, after = await get_json(session, "/fairserve/v1/state")
            return before, after

    before, after = run(body())
    assert "done 0" in traffic_line(before) and "clients 0" in traffic_line(before)
    assert "Jain (weighted, 60 s) n/a" in traffic_line(before)  # no client: no index
    line = traffic_line(after)
    assert "done 6" in line and "errors 0" in line and "clients 2" in line
    assert "Jain (weighted, 60 s)" in line
    rows = worker_traffic(after)
    assert sum(int(done) for _, done, _, _ in rows.values()) == 6
    assert all(health == "up" for health, _, _, _ in rows.values())
    assert traffic_line(None) == "router starting"
