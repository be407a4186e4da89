"""Forwarding one generation request: dispatch, retry, relay, account.

A :class:`Call` is one client request. :func:`serve` picks a worker with the dispatcher
(healthy workers not yet tried), waits for the worker's router-side fair queue if it has
one, sends the request over the worker's keep-alive connections (:mod:`~fairserve.router.pool`)
and writes the answer through a :class:`~fairserve.router.answer.Responder` (the lean front,
or aiohttp through :func:`forward`). A failure **before any byte reached the client**
(connection refused or reset, a 5xx, a stream that ends before its first event) releases
the worker in the dispatcher and tries another one; the failing worker is ejected when it
could not be reached. After the first byte a failure ends the stream with an SSE error event.

Whatever ends a call early (the client disconnects and its handler is cancelled, the router
shuts down), the ``finally`` clause closes the upstream connection of an answer not read to
its end and asks the worker to ``/abort_request`` the request id, so no GPU time is spent
for nobody.
"""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from fairserve.api.auth import admin_headers
from fairserve.core.errors import RequestRejected
from fairserve.core.openai_api import APP_HEADER, CLIENT_HEADER, ApiError, Route, error_body
from fairserve.router.accounting import Usage
from fairserve.router.answer import AiohttpResponder, Responder
from fairserve.router.fairqueue import FairQueue
from fairserve.router.framing import Response, UpstreamError
from fairserve.router.lifecycle import Call
from fairserve.router.pool import Pool, header_value
from fairserve.router.relay import InvalidAnswer, SseRelay, complete_body
from fairserve.router.upstream import Upstream
from fairserve.sched.dispatch.base import NoWorkerAvailable

if TYPE_CHECKING:
    from fairserve.router.service import Router

PATHS: dict[Route, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "generate": "/generate",
}
ABORT_TIMEOUT_S = 2.0


class UpstreamFailed(Exception):
    """An attempt failed before the client saw anything: another worker may serve it."""

    def __init__(self, reason: str, unreachable: bool = False) -> None:
        super().__init__(reason)
        self.unreachable = unreachable


async def forward(router: Router, call: Call, request: web.Request) -> web.StreamResponse:
    """Serve ``call`` on aiohttp: the response for the handler to return."""
    out = AiohttpResponder(request)
    await serve(router, call, out)
    assert out.response is not None
    return out.response


async def serve(router: Router, call: Call, out: Responder) -> None:
    """Serve ``call`` from some worker into ``out``. What happens to it is reported to the
    router's :class:`~fairserve.router.lifecycle.Lifecycle`, which ends it exactly once.
    Raises :class:`ApiError` for answers the router makes itself (503, 429)."""
    router.enter()
    life = router.lifecycle
    try:
        last_error = ""
        while True:
            worker = _choose_now(router, call, last_error)
            if worker is None:
                worker = await _choose(router, call, last_error)
            try:
                await _attempt(router, call, worker, out)
            except UpstreamFailed as exc:
                last_error = f"{worker}: {exc}"
                life.retry(call, worker, str(exc), exc.unreachable)
                continue
            if call.broken is None:
                life.judge(call, worker, None)
            else:
                life.judge(call, worker, call.broken, call.broken.startswith("stalled"))
            return
    finally:
        life.abort(call)  # nothing if it ended
        router.leave()


def _choose_now(router: Router, call: Call, last_error: str) -> str | None:
    """:func:`_choose` when it need not wait (a slot is open, or no worker is left to wait
    for): the chosen worker; None if it would wait. No coroutine for most requests."""
    tried = call.tried
    available = [u for u, up in router.upstreams.items() if up.healthy and u not in tried]
    open_workers = router.slots.open_for(call.client, available) if available else []
    if available and not open_workers:
        return None
    return _dispatch(router, call, open_workers, last_error)


async def _choose(router: Router, call: Call, last_error: str) -> str:
    """A worker for the next attempt: the dispatcher's choice among the healthy workers not
    tried yet that have a slot for the client (``router.slots``); waits for one up to the
    queue timeout."""
    slots = router.slots
    deadline_s = time.monotonic() + router.config.queue_timeout_s
    waited = False
    while True:
        tried = call.tried
        available = [u for u, up in router.upstreams.items() if up.healthy and u not in tried]
        open_workers = slots.open_for(call.client, available, waited) if available else []
        if open_workers or not available:
            break
        if not await slots.wait(call.client, deadline_s - time.monotonic()):
            slots.timed_out += 1
            router.lifecycle.fail(call)
            raise ApiError(
                503,
                f"every worker's running batch is full and client {call.client!r} holds its"
                f" share or more; no slot freed within {router.config.queue_timeout_s:g}s"
                " (--queue-timeout); retry later",
                headers={"Retry-After": "1"},
            )
        waited = True
    return _dispatch(router, call, open_workers, last_error)


def _dispatch(router: Router, call: Call, open_workers: list[str], last_error: str) -> str:
    """The dispatcher's choice among ``open_workers`` (503 or 502 when there is none),
    reported to the lifecycle."""
    try:
        worker = router.dispatcher.choose(call.req, open_workers)
    except NoWorkerAvailable:
        router.lifecycle.fail(call)
        if call.tried:
            status = 502 if call.bad_gateway else 503
            raise ApiError(status, f"every worker tried failed; last error: {last_error}") from None
        raise ApiError(
            503, "no healthy worker is available", headers={"Retry-After": "1"}
        ) from None
    router.lifecycle.dispatch(call, worker)
    return worker


async def _attempt(router: Router, call: Call, worker: str, out: Responder) -> None:
    """One attempt on ``worker``; released exactly once however it ends (an answer not
    read to its end closes its connection; a client that left also gets its request
    aborted by id, so no GPU time is spent for nobody)."""
    up = router.upstreams[worker]
    life = router.lifecycle
    usage: Usage | None = None
    resp: Response | None = None
    try:
        queue = up.queue
        if queue is not None and not _offer(router, call, queue):
            await _wait_queue(router, call, queue)
        life.send(call)
        resp = await _send(router, up, call)
        usage = await _relay(router, call, resp, out)
    finally:
        abandoned = usage is None and call.worker is not None and not call.ended
        life.release(call, usage)
        unfinished = resp is None or not resp.done
        if resp is not None and not resp.done:
            resp.close()
        if abandoned and call.posted and unfinished:
            router.spawn(_abort_upstream(router, worker, call.req.id))


def _offer(router: Router, call: Call, queue: FairQueue) -> bool:
    """Offer ``call`` to its worker's fair queue: whether it was released at once. One that
    was not waits there (:func:`_wait_queue`); one released at once never queued, as far as
    the lifecycle can tell (queuing and leaving in the same instant would change no count)."""
    try:
        return queue.offer(call.req)
    except RequestRejected as exc:
        raise _rejected(router, call, exc) from None


async def _wait_queue(router: Router, call: Call, queue: FairQueue) -> None:
    """Wait in the fair queue that :func:`_offer` left ``call`` in."""
    life = router.lifecycle
    life.queue(call)
    try:
        await queue.wait(call.req)
    finally:
        life.admit(call)  # nothing if it left otherwise


def _rejected(router: Router, call: Call, exc: RequestRejected) -> ApiError:
    """The 429 of a request the fair queue's policy refused (e.g. a rate limit)."""
    router.lifecycle.reject(call)
    retry = str(max(1, round(exc.retry_after_s)))
    return ApiError(429, str(exc), headers={"Retry-After": retry})


async def _send(router: Router, up: Upstream, call: Call) -> Response:
    pool = up.pool
    cfg = router.config
    if pool is None:
        pool = up.pool = Pool(
            up.url,
            cfg.connect_timeout_s,
            cfg.request_timeout_s,
            stall_timeout_s=cfg.stall_timeout_s,
        )
    head = up.heads.get(call.route)
    if head is None:
        head = up.heads[call.route] = pool.head(PATHS[call.route])
    call.posted = True
    try:
        first_byte_s = cfg.first_byte_timeout_s if call.stream else math.inf
        resp = await pool.post(head, _identity_headers(call), call.payload, first_byte_s)
    except UpstreamError as exc:
        raise UpstreamFailed(str(exc), unreachable=exc.unreachable) from None
    if resp.status >= 500:
        text = await _read_text(resp)
        resp.close()
        raise UpstreamFailed(f"answered {resp.status}: {text}")
    return resp


_CLIENT_PREFIX = CLIENT_HEADER.encode() + b": "
_APP_PREFIX = APP_HEADER.encode() + b": "


_CLIENT_LINES_MAX = 4096
_client_lines: dict[str, bytes] = {}
"""Each recent client's header line, built once (emptied when full)."""


def _identity_headers(call: Call) -> bytes:
    """``X-Fairserve-Client`` (and ``-App``) header lines; a name that cannot be a header
    value is left out (the body's ``routing_key`` carries the client anyway)."""
    lines = _client_lines.get(call.client)
    if lines is None:
        client = header_value(call.client)
        lines = _CLIENT_PREFIX + client + b"\r\n" if client is not None else b""
        if len(_client_lines) >= _CLIENT_LINES_MAX:
            _client_lines.clear()
        _client_lines[call.client] = lines
    if call.app is not None:
        app = header_value(call.app)
        if app is not None:
            lines += _APP_PREFIX + app + b"\r\n"
    return lines


async def _relay(router: Router, call: Call, resp: Response, out: Responder) -> Usage | None:
    """Relay the worker's answer; the usage of an answered request (None: it failed)."""
    if resp.status != 200:
        try:
            body = await resp.read()
        except UpstreamError as exc:
            raise UpstreamFailed(f"answer cut off: {exc}") from None
        out.answer(resp.status, body)
        router.lifecycle.fail(call)
        return None
    if call.stream:
        if not resp.content_type.startswith("text/event-stream"):
            resp.close()
            raise UpstreamFailed(f"invalid answer: {resp.content_type or 'no type'}, not a stream")
        return await _relay_stream(router, call, resp, out)
    try:
        data = await resp.read()
    except UpstreamError as exc:
        raise UpstreamFailed(f"answer cut off: {exc}") from None
    try:
        data, usage = complete_body(data, call.route, call.req.input_tokens)
    except InvalidAnswer as exc:
        raise UpstreamFailed(f"invalid answer: {exc}") from None
    now = time.monotonic()
    latency = now - call.start_s
    # Answered before the last write: a client that leaves during it still got its answer.
    router.lifecycle.answer(call, usage, latency, latency, now)
    out.answer(200, data)
    return usage


async def _relay_stream(router: Router, call: Call, resp: Response, out: Responder) -> Usage | None:
    life = router.lifecycle
    relay = SseRelay(call.route, call.want_usage, call.req.input_tokens)
    ttft_s: float | None = None
    try:
        while chunk := await resp.read_some():
            data = relay.feed(chunk)
            if relay.state.first_token:
                now = time.monotonic()
                if ttft_s is None:
                    ttft_s = now - call.start_s
                life.progress(call, relay.state.chunks, now)
            if not data:
                continue
            if not call.sent:
                await _open_stream(out, call)
            await out.write(data)
    except UpstreamError as exc:
        if not call.sent:
            raise UpstreamFailed(f"stream cut off: {exc}") from None
        call.broken = str(exc)
        life.fail(call)
        error = ApiError(502, f"the worker's stream broke off: {exc}")
        await out.write(b"data: " + json.dumps(error_body(error)).encode() + b"\n\n")
        await out.write_eof()
        return None
    if not call.sent and relay.state.chunks == 0:
        raise UpstreamFailed("stream ended without an event")
    if not call.sent:
        await _open_stream(out, call)
    await out.write(relay.close())
    usage = relay.usage()
    now = time.monotonic()
    latency = now - call.start_s
    life.answer(call, usage, latency, ttft_s if ttft_s is not None else latency, now)
    await out.write_eof()
    return usage


async def _open_stream(out: Responder, call: Call) -> None:
    call.sent = True
    await out.open_stream()


async def _abort_upstream(router: Router, worker: str, rid: str) -> None:
    if router.session is None:
        return
    try:
        async with router.session.post(
            worker + "/abort_request",
            json={"rid": rid},
            headers=admin_headers(router.config.admin_token),  # beyond loopback: required
            timeout=aiohttp.ClientTimeout(total=ABORT_TIMEOUT_S),
        ) as resp:
            await resp.read()
    except (aiohttp.ClientError, OSError, TimeoutError):
        pass


async def _read_text(resp: Response) -> str:
    try:
        return (await resp.read()).decode("utf-8", errors="replace")[:300]
    except UpstreamError:
        return ""


def _text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
