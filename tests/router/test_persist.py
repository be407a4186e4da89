"""Weights and quanta set live survive a router restart, and router and workers agree on
them afterwards; the settings file is private, written atomically, and a broken one never
keeps the router down."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fairserve.router import persist
from tests.router.helpers import get_json, routed, sim_workers
from tests.worker.helpers import run

TOKEN = "s3cret"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


async def _put(session: aiohttp.ClientSession, path: str, body: Any) -> int:
    async with session.put(path, json=body, headers=ADMIN) as resp:
        await resp.read()
        return resp.status


async def _worker_json(url: str, path: str) -> Any:
    async with aiohttp.ClientSession() as direct, direct.get(url + path) as resp:
        return await resp.json()


def test_a_restarted_router_keeps_live_weights_and_quanta(tmp_path: Path) -> None:
    settings = tmp_path / "settings.json"

    async def body() -> None:
        async with sim_workers(2) as workers:
            urls = [w.url for w in workers]
            options: dict[str, Any] = {"admin_token": TOKEN, "settings_path": str(settings)}
            async with routed(urls, **options) as (_, session):
                weight = {"client": "a", "weight": 3}
                assert await _put(session, "/fairserve/v1/weights", weight) == 200
                assert (
                    await _put(
                        session, "/fairserve/v1/quantum", {"quantum": 777, "worker_quantum": 9000}
                    )
                    == 200
                )
            assert stat.S_IMODE(os.stat(settings).st_mode) == 0o600
            for worker in workers:  # the workers forget, as after their own restart
                await _put_direct(worker.url, {"client": "a", "weight": 1})
            async with routed(urls, **options) as (_, session):
                _, weights = await get_json(session, "/fairserve/v1/weights")
                assert weights["weights"]["a"] == 3.0
                _, quantum = await get_json(session, "/fairserve/v1/quantum")
                assert quantum["quantum"] == 777.0 and quantum["worker_quantum"] == 9000.0
                _, state = await get_json(session, "/fairserve/v1/state")
                saved = state["router"]["settings"]
                assert saved["restored_at_start"] and saved["file"] == str(settings)
                for url in urls:  # pushed again: router and workers agree
                    await _wait_for(
                        url, "/fairserve/worker/weights", lambda w: w["weights"].get("a") == 3.0
                    )
                    await _wait_for(
                        url, "/fairserve/worker/quantum", lambda q: q["quantum"] == 777.0
                    )

    run(body())


async def _put_direct(url: str, body: dict[str, Any]) -> None:
    async with (
        aiohttp.ClientSession() as direct,
        direct.put(url + "/fairserve/worker/weights", json=body) as resp,
    ):
        assert resp.status == 200, await resp.text()


async def _wait_for(url: str, path: str, check: Any) -> None:
    for _ in range(100):
        if check(await _worker_json(url, path)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url}{path} never agreed: {await _worker_json(url, path)}")


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "settings.json"
    persist.save(path, persist.LiveSettings({"a": 2.0}, 512.0, float("inf")))
    loaded = persist.load(path)
    assert loaded is not None
    assert loaded.weights == {"a": 2.0} and loaded.quantum == 512.0
    assert loaded.worker_quantum == float("inf") and loaded.saved_at is not None
    assert list(path.parent.iterdir()) == [path], "no temporary file left behind"


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        json.dumps({"version": 99}),
        json.dumps({"version": 1, "weights": {"a": -1}}),
        json.dumps({"version": 1, "quantum": "lots"}),
    ],
)
def test_a_broken_file_is_set_aside(tmp_path: Path, text: str) -> None:
    path = tmp_path / "settings.json"
    path.write_text(text)
    assert persist.load(path) is None
    assert not path.exists()
    assert (tmp_path / "settings.json.broken").read_text() == text
