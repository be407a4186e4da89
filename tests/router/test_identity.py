"""Identities that cannot be claimed (issue 18): authentication modes and client names.

With a clients file an API key is required (401 without one) unless the operator trusts
a gateway's identity header (``--trust-identity-header``), and even then a header or
``user`` can never claim a keyed client (403). Client names are short and plain (400
otherwise), so no name can break ``/metrics`` afterwards. Real routers in front of real
simulated workers, on both request paths (the lean front and aiohttp).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fairserve.core.errors import ConfigError
from fairserve.core.openai_api import ApiError
from fairserve.router.config import ClientEntry, RouterConfig
from fairserve.router.identity import identify
from tests.router.helpers import chat, get_json, post, sim_router
from tests.worker.helpers import run

KEYS = {"k-alice": ClientEntry("alice", 2.0)}
WEIGHTS = {"alice": 2.0}
ALICE_KEY = {"Authorization": "Bearer k-alice"}
PATHS = pytest.mark.parametrize("lean_front", [True, False], ids=["lean", "aiohttp"])


def _error(status: int, answer: Any, text: str) -> None:
    assert isinstance(answer, dict) and set(answer) == {"error"}, answer
    error = answer["error"]
    assert error["code"] == status and text in error["message"], answer
    kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error"}
    assert error["type"] == kinds[status], answer


@PATHS
def test_a_clients_file_requires_an_api_key(lean_front: bool) -> None:
    async def body() -> None:
        overrides: dict[str, Any] = {"clients": KEYS, "weights": WEIGHTS, "lean_front": lean_front}
        async with sim_router(1, **overrides) as (_, session, _):
            for headers, request in (
                ({}, chat()),
                ({"X-Fairserve-Client": "alice"}, chat()),
                ({}, chat(user="alice")),
                ({"X-Fairserve-Client": "bob"}, chat(user="carol")),
            ):
                status, answer, _ = await post(
                    session, "/v1/chat/completions", request, headers=headers
                )
                assert status == 401, (headers, request, answer)
                _error(401, answer, "API key required")
            status, answer, _ = await post(
                session, "/v1/chat/completions", chat(), headers=ALICE_KEY
            )
            assert status == 200, answer
            _, state = await get_json(session, "/fairserve/v1/state")
            assert sorted(state["clients"]) == ["alice"]
            assert state["clients"]["alice"]["weight"] == 2.0
            assert state["router"]["auth_mode"] == "api-key"

    run(body())


@PATHS
def test_an_unauthenticated_client_learns_nothing_of_its_body(lean_front: bool) -> None:
    """With a clients file, a request without a valid key is refused (401) before its body
    is read: a malformed or invalid body gets the same answer as a good one, and a keyed
    client still gets the body's 400."""

    async def body() -> None:
        overrides: dict[str, Any] = {"clients": KEYS, "weights": WEIGHTS, "lean_front": lean_front}
        async with sim_router(1, **overrides) as (_, session, _):
            bad_bodies = (b"{not json", b'{"model": "m", "messages": 5}', b"\xff\xfe")
            for raw in bad_bodies:
                for headers, text in (
                    ({}, "API key required"),
                    ({"Authorization": "Bearer nope"}, "unknown API key"),
                ):
                    sent = {"Content-Type": "application/json", **headers}
                    async with session.post("/v1/chat/completions", data=raw, headers=sent) as r:
                        _error(401, await r.json(content_type=None), text)
                sent = {"Content-Type": "application/json", **ALICE_KEY}
                async with session.post("/v1/chat/completions", data=raw, headers=sent) as r:
                    assert r.status == 400, raw

    run(body())


@PATHS
def test_a_trusted_header_never_claims_a_keyed_client(lean_front: bool) -> None:
    async def body() -> None:
        overrides: dict[str, Any] = {"clients": KEYS, "weights": WEIGHTS, "lean_front": lean_front}
        async with sim_router(1, trust_identity_header=True, **overrides) as (_, session, _):
            for headers, request in (
                ({"X-Fairserve-Client": "alice"}, chat()),
                ({}, chat(user="alice")),
            ):
                status, answer, _ = await post(
                    session, "/v1/chat/completions", request, headers=headers
                )
                assert status == 403, (headers, request, answer)
                _error(403, answer, "'alice' is a client of the clients file")
            served = [
                ({"X-Fairserve-Client": "bob"}, chat(user="carol")),
                ({}, chat(user="carol")),
                ({}, chat()),
                ({**ALICE_KEY, "X-Fairserve-Client": "bob"}, chat()),
            ]
            for headers, request in served:
                status, answer, _ = await post(
                    session, "/v1/chat/completions", request, headers=headers
                )
                assert status == 200, (headers, request, answer)
            _, state = await get_json(session, "/fairserve/v1/state")
            assert sorted(state["clients"]) == ["alice", "anonymous", "bob", "carol"]
            assert state["clients"]["alice"]["finished"] == 1
            assert state["router"]["auth_mode"] == "api-key+trusted-header"

    run(body())


def test_without_a_clients_file_identities_are_open() -> None:
    async def body() -> None:
        async with sim_router(1) as (_, session, _):
            for headers, request in (
                ({"X-Fairserve-Client": "bob", "Authorization": "Bearer EMPTY"}, chat()),
                ({}, chat(user="carol")),
                ({}, chat()),
            ):
                status, answer, _ = await post(
                    session, "/v1/chat/completions", request, headers=headers
                )
                assert status == 200, answer
            _, state = await get_json(session, "/fairserve/v1/state")
            assert sorted(state["clients"]) == ["anonymous", "bob", "carol"]
            assert state["router"]["auth_mode"] == "open"

    run(body())


def test_a_body_routing_key_never_names_the_client_upstream() -> None:
    """The worker charges ``routing_key``: the router's identity replaces the client's."""

    async def body() -> None:
        overrides: dict[str, Any] = {"clients": KEYS, "weights": WEIGHTS}
        async with sim_router(1, trust_identity_header=True, **overrides) as (_, session, w):
            for headers in ({"X-Fairserve-Client": "bob"}, {}):
                status, answer, _ = await post(
                    session, "/v1/chat/completions", chat(routing_key="alice"), headers=headers
                )
                assert status == 200, answer
            runtime = w[0].runtime
            assert runtime is not None
            assert set(runtime.state()["policy"]["clients"]) == {"bob", "anonymous"}

    run(body())


def test_identify_by_mode() -> None:
    """The pure rules, mode by mode."""
    assert identify({"Authorization": "Bearer k-alice"}, {"user": "x"}, KEYS) == "alice"
    with pytest.raises(ApiError) as info:
        identify({"X-Fairserve-Client": "bob"}, {}, KEYS)
    assert info.value.status == 401
    assert identify({"X-Fairserve-Client": "bob"}, {"user": "carol"}, KEYS, True) == "bob"
    assert identify({}, {"user": "carol"}, KEYS, True) == "carol"
    assert identify({}, {}, KEYS, True) == "anonymous"
    with pytest.raises(ApiError) as info:
        identify({"X-Fairserve-Client": " alice "}, {}, KEYS, True)
    assert info.value.status == 403
    with pytest.raises(ApiError) as info:
        identify({"Authorization": "Bearer wrong", "X-Fairserve-Client": "bob"}, {}, KEYS, True)
    assert info.value.status == 401 and "unknown API key" in info.value.message
    assert identify({"Authorization": "Bearer EMPTY"}, {"user": "carol"}, {}) == "carol"


def test_trusting_the_header_needs_a_clients_file() -> None:
    with pytest.raises(ConfigError, match=r"--trust-identity-header: .*--clients"):
        RouterConfig(worker_urls=("http://127.0.0.1:9",), trust_identity_header=True)


# ------------------------------------------------------------------ names
BAD_NAMES = ["x" * 65, "a b", "semi;colon", 'quote"', "tab\tname", "é", "\ud800", "emoji\U0001f600"]
GOOD_NAMES = ["x" * 64, "team-a", "org/team.b", "user@example.com", "svc:batch_1"]


@PATHS
def test_client_names_are_checked(lean_front: bool) -> None:
    async def body() -> None:
        async with sim_router(1, lean_front=lean_front) as (_, session, _):
            for name in BAD_NAMES:
                status, answer, _ = await post(session, "/v1/chat/completions", chat(user=name))
                assert status == 400, (name, answer)
                _error(400, answer, "user: a client name is 1 to 64 characters")
                if name.isprintable() and name.isascii():
                    headers = {"X-Fairserve-Client": name}
                    status, answer, _ = await post(
                        session, "/v1/chat/completions", chat(), headers=headers
                    )
                    assert status == 400, (name, answer)
                    _error(400, answer, "X-Fairserve-Client: a client name is 1 to 64")
            for name in GOOD_NAMES:
                status, answer, _ = await post(session, "/v1/chat/completions", chat(user=name))
                assert status == 200, (name, answer)
            _, state = await get_json(session, "/fairserve/v1/state")
            assert sorted(state["clients"]) == sorted(GOOD_NAMES)

    run(body())


async def _raw_status(url: str, head: bytes, payload: bytes) -> int:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), 10.0)
    writer.close()
    return int(line.split()[1])


@PATHS
def test_a_raw_byte_or_a_lone_surrogate_in_a_name_never_breaks_metrics(lean_front: bool) -> None:
    """Before: one ``user`` holding a lone surrogate (or ``\\xff`` in the header) made every
    later ``/metrics`` answer 500."""

    async def body() -> None:
        async with sim_router(1, lean_front=lean_front) as (server, session, _):
            start = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            start += b"Content-Type: application/json\r\n"
            payload = json.dumps(chat()).encode()
            for extra in (b"X-Fairserve-Client: \xff\r\n", b"X-Fairserve-Client: a\xc3\xa9\r\n"):
                assert await _raw_status(server.url, start + extra, payload) == 400
            surrogate = json.dumps(chat(user="\ud800")).encode()
            assert await _raw_status(server.url, start, surrogate) == 400
            app = b"X-Fairserve-App: \xff\r\n"
            assert await _raw_status(server.url, start + app, payload) == 400
            async with session.get("/metrics") as resp:
                assert resp.status == 200, await resp.text()
            status, state = await get_json(session, "/fairserve/v1/state")
            assert status == 200 and list(state["clients"]) == []

    run(body())


# ------------------------------------------------------------------ the command line
def _fairserve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fairserve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"NO_COLOR": "1", "COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


def test_router_and_launch_take_the_flag(tmp_path: Path) -> None:
    assert "--trust-identity-header" in _fairserve("router", "--help").stdout
    clients = tmp_path / "clients.toml"
    clients.write_text('[[clients]]\nname = "alice"\napi_key = "k-alice"\n')
    base = ["launch", "--engine", "sim", "--dry-run", "--json", "--port", "0"]
    plain = _fairserve(*base, "--clients", str(clients))
    trusted = _fairserve(*base, "--clients", str(clients), "--trust-identity-header")
    assert plain.returncode == 0 and trusted.returncode == 0, plain.stderr + trusted.stderr
    assert json.loads(plain.stdout)["router"]["auth_mode"] == "api-key"
    assert json.loads(trusted.stdout)["router"]["auth_mode"] == "api-key+trusted-header"
    alone = _fairserve(*base, "--trust-identity-header")
    assert alone.returncode != 0 and "--trust-identity-header" in alone.stderr


def test_status_shows_the_identity_mode() -> None:
    from fairserve.commands.status import _table

    router = {"url": "http://127.0.0.1:1", "healthy": True, "policy": "dlpm"}
    data = {
        "router": {**router, "dispatch": "doubleq", "auth_mode": "api-key"},
        "quantum": {},
        "workers": [],
    }
    title = _table(data).title
    assert isinstance(title, str) and "identity api-key" in title
