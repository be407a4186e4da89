"""Bounded requests through a real router and real simulated workers (issue 18, items 2, 6
and 12): what exceeds the model's context is refused by the router itself, quickly, with
SGLang's and vLLM's kind of message; malformed and extreme bodies get a 400 that says what
is wrong, from the router and from the worker alike, never a 500."""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from contextlib import AsyncExitStack
from typing import Any, cast

import aiohttp
import pytest

from fairserve.router.upstream import context_length
from fairserve.sched.dispatch.base import Dispatcher
from fairserve.worker.server import WorkerServer
from tests.router.helpers import routed, sim_router
from tests.worker.helpers import make_config, run, tiny_profile

CONTEXT_TOKENS = 4096
"""The tiny profile's KV capacity: the simulated worker's context length."""


async def _post_raw(
    session: aiohttp.ClientSession, url: str, data: bytes
) -> tuple[int, dict[str, Any], float]:
    started = time.perf_counter()
    headers = {"Content-Type": "application/json"}
    async with session.post(url, data=data, headers=headers) as resp:
        text = await resp.text()
        elapsed_s = time.perf_counter() - started
    return resp.status, json.loads(text), elapsed_s


def test_a_request_beyond_the_context_is_refused_by_the_router_within_50_ms() -> None:
    async def body() -> None:
        async with sim_router(count=2) as (server, session, _):
            data = json.dumps({"prompt": "hello world", "max_tokens": CONTEXT_TOKENS}).encode()
            elapsed: list[float] = []
            for _ in range(30):
                status, answer, elapsed_s = await _post_raw(session, "/v1/completions", data)
                assert status == 400, answer
                assert answer["error"]["message"].startswith(
                    f"This model's maximum context length is {CONTEXT_TOKENS} tokens. However,"
                    f" you requested at least {CONTEXT_TOKENS + 1} tokens (at least 1 in the"
                    " prompt, "  # a text prompt's tokens are the worker's to count
                )
                elapsed.append(elapsed_s)
            assert statistics.median(elapsed) < 0.05, elapsed
            # No worker was asked: the router never opened an upstream connection.
            assert all(up.pool is None for up in server.router.upstreams.values())
            fits = {"prompt": "hello world", "max_tokens": CONTEXT_TOKENS - 3}
            status, answer, _ = await _post_raw(
                session, "/v1/completions", json.dumps({**fits, "max_tokens": 3}).encode()
            )
            assert status == 200, answer

    run(body())


def test_a_text_prompt_the_worker_would_take_is_not_refused_on_the_routers_estimate() -> None:
    # "hello world" is 2 tokens to the worker and 3 key units (11 bytes) to the router: at
    # the limit by the worker's count, the router must pass it on, not refuse it on a guess.
    async def body() -> None:
        async with sim_router(count=1) as (_, session, _):
            data = json.dumps({"prompt": "hello world", "max_tokens": CONTEXT_TOKENS - 2})
            status, answer, _ = await _post_raw(session, "/v1/completions", data.encode())
            assert status == 200, answer
            assert answer["usage"]["prompt_tokens"] == 2
            over = json.dumps({"prompt": "hello world", "max_tokens": CONTEXT_TOKENS - 1})
            status, answer, _ = await _post_raw(session, "/v1/completions", over.encode())
            assert status == 400, answer  # the worker's exact count refuses it
            assert "(2 in the prompt" in answer["error"]["message"]

    run(body())


def test_the_router_uses_the_smallest_context_among_healthy_workers() -> None:
    async def body() -> None:
        async with AsyncExitStack() as stack:
            urls = []
            for capacity in (4096, 2048):
                config = make_config(profile=tiny_profile(capacity), speed=200.0)
                worker = WorkerServer(config, "127.0.0.1", 0)
                await worker.start()
                stack.push_async_callback(worker.stop)
                urls.append(worker.url)
            _, session = await stack.enter_async_context(routed(urls))
            data = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 3000}})
            status, answer, _ = await _post_raw(session, "/generate", data.encode())
            assert status == 400
            assert "maximum context length is 2048 tokens" in answer["error"]["message"]

    run(body())


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": ' + b"9" * 30 + b"}", "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 9223372036854775808}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 1e20}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": "1e20"}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 1000000000}', "maximum context"),
    ("/generate", b'{"text": "hi", "sampling_params": {"max_new_tokens": 9223372036854775808}}',
     "sampling_params.max_new_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": -1}', "temperature"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": NaN}', "NaN"),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}', "Infinity"),
    ("/v1/completions", b'{"prompt": "hi", "routing_key": ' + _nested(5000) + b"}", "nested"),
    ("/v1/completions", b'{"prompt": "hi", "stream": true, "x": ' + _nested(900) + b"}",
     "nested"),
    ("/generate", _nested(100_000), "nested"),
    ("/v1/completions", b'{"prompt": "a\\ud800b"}', "prompt"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udfff"}]}',
     "messages[0].content"),
    ("/v1/completions", b'{"prompt": "hi", "user": "\\ud800"}', "user"),
    ("/generate", b'{"input_ids": [' + b"7," * 100_000 + b"7]}", "maximum context"),
]  # fmt: skip


@pytest.mark.parametrize("lean_front", [True, False])
def test_malformed_and_extreme_bodies_are_400_from_router_and_worker(lean_front: bool) -> None:
    async def body() -> None:
        async with sim_router(count=1, lean_front=lean_front) as (_, session, workers):
            for path, data, expected in BAD_BODIES:
                for base in ("", workers[0].url):
                    status, answer, _ = await _post_raw(session, base + path, data)
                    message = answer["error"]["message"]
                    where = f"{base or 'router'}{path} {data[:60]!r}"
                    assert status == 400, (where, status, message)
                    assert expected in message, (where, message)
                    assert "Traceback" not in message and "internal" not in message

    run(body())


def test_a_body_over_the_limit_is_413_on_both_fronts() -> None:
    async def body() -> None:
        for lean_front in (True, False):
            async with sim_router(count=1, lean_front=lean_front, max_body_bytes=1000) as (
                _,
                session,
                _,
            ):
                data = json.dumps({"prompt": "x" * 5000}).encode()
                status, answer, _ = await _post_raw(session, "/v1/completions", data)
                assert status == 413, answer
                assert "the limit is 1000 bytes" in answer["error"]["message"]

    run(body())


class _BrokenChoice:
    """A dispatcher with a bug: ``choose`` raises; everything else is the real one's."""

    def __init__(self, real: Dispatcher) -> None:
        self._real = real

    def choose(self, req: object, available: object) -> str:
        raise RuntimeError("secret detail 42")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.mark.parametrize("lean_front", [True, False])
def test_an_internal_error_reaches_the_client_as_an_error_id_only(
    lean_front: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 18 item 12: the cause goes to the log, one line and no traceback; the client
    gets a 500 with an id to quote, never the exception's text."""

    async def body() -> None:
        async with sim_router(count=1, lean_front=lean_front) as (server, session, _):
            router = server.router
            router.dispatcher = cast(Dispatcher, _BrokenChoice(router.dispatcher))
            data = json.dumps({"prompt": "hello", "max_tokens": 2}).encode()
            with caplog.at_level(logging.INFO, logger="fairserve"):
                status, answer, _ = await _post_raw(session, "/v1/completions", data)
            assert status == 500
            message = answer["error"]["message"]
            assert message.startswith("internal error (error id ")
            assert "secret" not in message and "RuntimeError" not in message
            error_id = message.split("error id ")[1].split(")")[0]
            logged = [r for r in caplog.records if error_id in r.getMessage()]
            assert len(logged) == 1 and logged[0].exc_info is None
            assert "RuntimeError: secret detail 42" in logged[0].getMessage()

    run(body())


def test_a_workers_context_length_comes_from_its_models_else_its_server_info() -> None:
    models = {"data": [{"id": "a", "max_model_len": 8192}, {"id": "b", "max_model_len": 4096}]}
    assert context_length({"context_length": 100}, models) == 4096  # SGLang and vLLM
    assert context_length({"context_length": 2048}, {"data": [{"id": "a"}]}) == 2048
    assert context_length({"context_length": None}, None) is None  # unknown: not checked
    assert context_length({"context_length": True}, {"data": [{"max_model_len": -1}]}) is None


def test_requests_beyond_the_context_leave_other_clients_latency_alone() -> None:
    """A client sending over-long requests (100 per second for 1.5 s) costs the others
    nothing measurable: they are refused before any worker sees them."""

    async def body() -> None:
        async with sim_router(count=2) as (_, session, _):
            ok = json.dumps({"prompt": "hello world", "max_tokens": 8}).encode()
            huge = json.dumps({"prompt": "hi", "max_tokens": 10 * CONTEXT_TOKENS}).encode()

            async def victim_latencies_s() -> list[float]:
                latencies = []
                for _ in range(15):
                    status, _, elapsed_s = await _post_raw(session, "/v1/completions", ok)
                    assert status == 200
                    latencies.append(elapsed_s)
                return latencies

            async def attack() -> None:
                for _ in range(150):  # bounded: 150 requests, ~1.5 s
                    status, _, _ = await _post_raw(session, "/v1/completions", huge)
                    assert status == 400
                    await asyncio.sleep(0.01)

            alone = statistics.median(await victim_latencies_s())
            attacked, _ = await asyncio.gather(victim_latencies_s(), attack())
            assert statistics.median(attacked) < 2 * alone + 0.02, (alone, attacked)

    run(body())
