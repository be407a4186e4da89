"""The generation endpoints: ``/generate``, ``/v1/completions``, ``/v1/chat/completions``.

A handler parses its body into a :class:`~fairserve.core.openai_api.GenerationSpec`, submits it
to the runtime and then either waits for the outcome or streams Server-Sent Events as the
engine produces tokens. Whatever ends the handler early (the client disconnects, the server
cancels it), the ``finally`` clause aborts the request in the engine, so no simulated GPU
time is spent for nobody.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from fairserve.core.errors import ConfigError, RequestRejected
from fairserve.core.json_body import parse_json
from fairserve.core.openai_api import (
    ApiError,
    GenerationSpec,
    bad_request,
    parse_chat,
    parse_completion,
    parse_generate,
)
from fairserve.worker import responses as r
from fairserve.worker.runtime import DuplicateRequest, Ticket, Unavailable, WorkerRuntime

RUNTIME: web.AppKey[WorkerRuntime] = web.AppKey("runtime", WorkerRuntime)

Parser = Callable[[Mapping[str, Any], Mapping[str, str]], GenerationSpec]


def _handler(parse: Parser) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.StreamResponse:
        spec = parse(parse_json(await request.read()), request.headers)
        return await serve(request, spec)

    return handle


generate = _handler(parse_generate)
completions = _handler(parse_completion)
chat_completions = _handler(parse_chat)


def submit(runtime: WorkerRuntime, spec: GenerationSpec) -> Ticket:
    """Submit, translating the runtime's refusals into HTTP errors."""
    try:
        return runtime.submit(spec)
    except RequestRejected as exc:
        wall_s = exc.retry_after_s / runtime.config.speed
        retry = str(max(1, math.ceil(wall_s))) if math.isfinite(wall_s) else "60"
        raise ApiError(429, str(exc), headers={"Retry-After": retry}) from None
    except (ConfigError, DuplicateRequest) as exc:
        raise bad_request(str(exc)) from None
    except Unavailable as exc:
        raise ApiError(503, str(exc)) from None


async def serve(request: web.Request, spec: GenerationSpec) -> web.StreamResponse:
    runtime = request.app[RUNTIME]
    ticket = submit(runtime, spec)
    try:
        if spec.stream:
            return await _stream(request, ticket)
        await ticket.wait_done()
        if ticket.error is not None:
            raise ApiError(500, ticket.error)
        return web.json_response(_final_body(ticket, runtime), dumps=r.dumps)
    finally:
        if not ticket.done:
            runtime.abort(spec.rid, "client disconnected")


def _final_body(ticket: Ticket, runtime: WorkerRuntime) -> dict[str, Any]:
    route = ticket.spec.route
    if route == "generate":
        return r.native_body(ticket)
    model = _model(ticket, runtime)
    created = int(time.time())
    if route == "completions":
        return r.completion_body(ticket, model, created)
    return r.chat_body(ticket, model, created)


def _model(ticket: Ticket, runtime: WorkerRuntime) -> str:
    return ticket.spec.model or runtime.config.model_name


async def _stream(request: web.Request, ticket: Ticket) -> web.StreamResponse:
    runtime = request.app[RUNTIME]
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    writer = _ChunkWriter(ticket, _model(ticket, runtime), int(time.time()))
    for chunk in writer.opening():
        await response.write(r.sse(chunk))
    sent = 0
    while True:
        if not ticket.done:
            await ticket.next_change()
        if ticket.error is not None:
            await response.write(r.sse(r.error_body(ApiError(500, ticket.error))))
            break
        produced = ticket.produced
        if produced > sent or ticket.done:
            for chunk in writer.chunks(sent, produced):
                await response.write(r.sse(chunk))
            sent = produced
        if ticket.done:
            for chunk in writer.closing():
                await response.write(r.sse(chunk))
            break
    await response.write(r.SSE_DONE)
    await response.write_eof()
    return response


class _ChunkWriter:
    """Which SSE chunks a route sends when a stream opens, advances and ends."""

    def __init__(self, ticket: Ticket, model: str, created: int) -> None:
        self.ticket = ticket
        self.model = model
        self.created = created

    def opening(self) -> list[dict[str, Any]]:
        if self.ticket.spec.route != "chat":
            return []
        delta = {"role": "assistant", "content": ""}
        return [r.chat_chunk(self.ticket, self.model, self.created, delta)]

    def chunks(self, start: int, stop: int) -> list[dict[str, Any]]:
        ticket, route = self.ticket, self.ticket.spec.route
        if route == "generate":
            return [r.native_body(ticket)]
        if route == "completions":
            return [r.completion_chunk(ticket, self.model, self.created, start, stop)]
        out = []
        if stop > start:
            delta = {"content": r.chat_content(ticket, start, stop)}
            out.append(r.chat_chunk(ticket, self.model, self.created, delta))
        if ticket.done:
            finish = r.openai_finish(ticket)
            out.append(r.chat_chunk(ticket, self.model, self.created, {}, finish))
        return out

    def closing(self) -> list[dict[str, Any]]:
        if self.ticket.spec.route != "generate" and self.ticket.spec.include_usage:
            return [r.usage_chunk(self.ticket, self.model, self.created)]
        return []
