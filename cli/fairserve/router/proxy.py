"""Forwarding one generation request: dispatch, retry, relay, account.

A :class:`Call` is one client request. :func:`forward` picks a worker with the dispatcher
(healthy workers not yet tried), waits for the worker's router-side fair queue if it has
one, and sends the request. A failure **before any byte reached the client** (connection
refused or reset, a 5xx, a stream that ends before its first event) releases the worker in
the dispatcher and tries another one; the failing worker is ejected when it could not be
reached. After the first byte a failure ends the stream with an SSE error event.

Whatever ends a call early (the client disconnects and aiohttp cancels the handler, the
router shuts down), the ``finally`` clause closes the upstream response and asks the worker
to ``/abort_request`` the request id, so no GPU time is spent for nobody.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from yarl import URL

from fairserve.core.errors import RequestRejected
from fairserve.core.openai_api import APP_HEADER, CLIENT_HEADER, ApiError, Route, error_body
from fairserve.core.types import Request
from fairserve.router.accounting import Usage
from fairserve.router.fairqueue import FairQueue
from fairserve.router.relay import SseRelay, complete_body
from fairserve.sched.dispatch.base import NoWorkerAvailable

if TYPE_CHECKING:
    from fairserve.router.service import Router

PATHS: dict[Route, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "generate": "/generate",
}
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
ABORT_TIMEOUT_S = 2.0


class UpstreamFailed(Exception):
    """An attempt failed before the client saw anything: another worker may serve it."""

    def __init__(self, reason: str, unreachable: bool = False) -> None:
        super().__init__(reason)
        self.unreachable = unreachable


@dataclass(slots=True, eq=False)
class Call:
    """One client request on its way through the router."""

    route: Route
    client: str
    req: Request
    payload: bytes
    stream: bool
    want_usage: bool
    estimate: float
    start_s: float
    app: str | None = None
    tried: list[str] = field(default_factory=list)
    sent: bool = False
    ended: bool = False


async def forward(router: Router, call: Call, request: web.Request) -> web.StreamResponse:
    """Serve ``call`` from some worker; every exit path is accounted exactly once."""
    router.enter()
    try:
        last_error = ""
        while True:
            worker = _choose(router, call, last_error)
            try:
                return await _attempt(router, call, worker, request)
            except UpstreamFailed as exc:
                last_error = f"{worker}: {exc}"
                router.accounting.worker(worker).failures += 1
                if exc.unreachable:
                    router.eject(worker, str(exc))
    finally:
        if not call.ended:
            _end(router, call, "aborted")
        router.leave()


def _choose(router: Router, call: Call, last_error: str) -> str:
    available = [w for w in router.healthy() if w not in call.tried]
    try:
        worker = router.dispatcher.choose(call.req, available)
    except NoWorkerAvailable:
        if call.tried:
            _end(router, call, "failed")
            raise ApiError(503, f"every worker tried failed; last error: {last_error}") from None
        _end(router, call, "failed")
        raise ApiError(
            503, "no healthy worker is available", headers={"Retry-After": "1"}
        ) from None
    if call.tried:
        router.accounting.worker(worker).retried += 1
    call.tried.append(worker)
    return worker


async def _attempt(
    router: Router, call: Call, worker: str, request: web.Request
) -> web.StreamResponse:
    up = router.upstreams[worker]
    req = call.req
    router.dispatcher.on_dispatch(req, worker)
    router.bound_tree(worker)
    router.accounting.worker(worker).requests += 1
    up.in_flight += 1
    outcome: Usage | str = "aborted"
    resp: aiohttp.ClientResponse | None = None
    queued = up.queue
    try:
        if queued is not None:
            await _wait_queue(router, call, queued)
        resp = await _send(router, worker, call)
        response, outcome = await _relay(router, call, resp, request)
        return response
    except UpstreamFailed:
        outcome = "retry"
        raise
    finally:
        up.in_flight -= 1
        _release(router, call, worker, outcome, resp)


async def _wait_queue(router: Router, call: Call, queue: FairQueue) -> None:
    stats = router.accounting.client(call.client)
    stats.queued += 1
    try:
        await queue.acquire(call.req)
    except RequestRejected as exc:
        _end(router, call, "rejected")
        retry = str(max(1, round(exc.retry_after_s)))
        raise ApiError(429, str(exc), headers={"Retry-After": retry}) from None
    finally:
        stats.queued -= 1


async def _send(router: Router, worker: str, call: Call) -> aiohttp.ClientResponse:
    assert router.session is not None
    headers = {"Content-Type": "application/json", CLIENT_HEADER: call.client}
    if call.app is not None:
        headers[APP_HEADER] = call.app
    try:
        resp = await router.session.post(
            _url(worker, call.route), data=call.payload, headers=headers
        )
    except (aiohttp.ClientConnectionError, OSError) as exc:
        raise UpstreamFailed(_text(exc), unreachable=True) from None
    except TimeoutError:
        raise UpstreamFailed("timed out", unreachable=True) from None
    if resp.status >= 500:
        text = await _read_text(resp)
        resp.release()
        raise UpstreamFailed(f"answered {resp.status}: {text}")
    return resp


_URLS: dict[tuple[str, Route], URL] = {}


def _url(worker: str, route: Route) -> URL:
    """The parsed upstream URL, built once per worker and route (not per request)."""
    url = _URLS.get((worker, route))
    if url is None:
        url = _URLS[(worker, route)] = URL(worker + PATHS[route])
    return url


async def _relay(
    router: Router, call: Call, resp: aiohttp.ClientResponse, request: web.Request
) -> tuple[web.StreamResponse, Usage | str]:
    if resp.status != 200:
        body = await resp.read()
        return web.Response(
            body=body, status=resp.status, content_type="application/json"
        ), "failed"
    if call.stream:
        return await _relay_stream(router, call, resp, request)
    try:
        data = await resp.read()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise UpstreamFailed(f"answer cut off: {_text(exc)}") from None
    data, usage = complete_body(data, call.route, call.req.input_tokens)
    latency = time.monotonic() - call.start_s
    _finish(router, call, usage, latency, latency)
    return web.Response(body=data, content_type="application/json"), usage


async def _relay_stream(
    router: Router, call: Call, resp: aiohttp.ClientResponse, request: web.Request
) -> tuple[web.StreamResponse, Usage | str]:
    relay = SseRelay(call.route, call.want_usage, call.req.input_tokens)
    out: web.StreamResponse | None = None
    ttft_s: float | None = None
    try:
        async for chunk in resp.content.iter_any():
            data = relay.feed(chunk)
            if ttft_s is None and relay.state.first_token:
                ttft_s = time.monotonic() - call.start_s
            if not data:
                continue
            if out is None:
                out = await _open_stream(request, call)
            await out.write(data)
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError) as exc:
        if out is None:
            raise UpstreamFailed(f"stream cut off: {_text(exc)}") from None
        error = ApiError(502, f"the worker's stream broke off: {_text(exc)}")
        await out.write(b"data: " + json.dumps(error_body(error)).encode() + b"\n\n")
        await out.write_eof()
        return out, "failed"
    if out is None and relay.state.chunks == 0:
        raise UpstreamFailed("stream ended without an event")
    if out is None:
        out = await _open_stream(request, call)
    await out.write(relay.close())
    usage = relay.usage()
    latency = time.monotonic() - call.start_s
    _finish(router, call, usage, latency, ttft_s if ttft_s is not None else latency)
    await out.write_eof()
    return out, usage


async def _open_stream(request: web.Request, call: Call) -> web.StreamResponse:
    out = web.StreamResponse(headers=SSE_HEADERS)
    call.sent = True
    await out.prepare(request)
    return out


# ------------------------------------------------------------------ endings
def _finish(
    router: Router, call: Call, usage: Usage, latency_s: float, ttft_s: float | None
) -> None:
    """Account a request that ended with an answer (before the last write: a client that
    leaves during ``write_eof`` still got its answer)."""
    if call.ended:
        return
    call.ended = True
    worker = call.tried[-1]
    now = time.monotonic()
    service = router.accounting.finished(
        call.client, worker, call.estimate, usage, latency_s, ttft_s, now
    )
    router.metrics.finished(call.client, service, usage, latency_s, ttft_s)
    if router.trace is not None:
        router.trace.write(
            call.client,
            call.app,
            call.start_s - router.started_s,
            call.req.prompt_key,
            usage.completion_tokens,
            call.req.max_output_tokens,
        )


def _end(router: Router, call: Call, outcome: str) -> None:
    if call.ended:
        return
    call.ended = True
    router.accounting.ended(call.client, call.estimate, outcome)
    router.metrics.ended(call.client, outcome)


def _release(
    router: Router,
    call: Call,
    worker: str,
    outcome: Usage | str,
    resp: aiohttp.ClientResponse | None,
) -> None:
    """Give the worker's slot back in the dispatcher and the fair queue; abort upstream
    work nobody will read."""
    req, up = call.req, router.upstreams[worker]
    if isinstance(outcome, Usage):
        req.cached_tokens = min(outcome.cached_tokens, req.input_tokens)
        req.output_tokens = outcome.completion_tokens
        router.dispatcher.on_finish(req, worker, outcome.completion_tokens)
        if up.queue is not None:
            up.queue.finish(req, outcome.completion_tokens, outcome.cached_tokens)
    else:
        router.dispatcher.on_abort(req, worker)
        if up.queue is not None:
            up.queue.abort(req)
        if outcome == "failed":
            _end(router, call, "failed")
    if resp is not None and not resp.closed and not isinstance(outcome, Usage):
        was_done = resp.content.at_eof()
        resp.close()
        if not was_done and outcome == "aborted":
            router.spawn(_abort_upstream(router, worker, req.id))
    elif resp is not None:
        resp.release()


async def _abort_upstream(router: Router, worker: str, rid: str) -> None:
    if router.session is None:
        return
    try:
        async with router.session.post(
            worker + "/abort_request",
            json={"rid": rid},
            timeout=aiohttp.ClientTimeout(total=ABORT_TIMEOUT_S),
        ) as resp:
            await resp.read()
    except (aiohttp.ClientError, OSError, TimeoutError):
        pass


async def _read_text(resp: aiohttp.ClientResponse) -> str:
    try:
        return (await resp.text(errors="replace"))[:300]
    except (aiohttp.ClientError, OSError, TimeoutError):
        return ""


def _text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
