"""The aiohttp application and its lifecycle: bind, serve, shut down gracefully.

:class:`WorkerServer` is what ``fairserve worker``, ``launch`` and the tests all start, so
the tests exercise the same sockets, runner options and shutdown path as production.

* Handlers are cancelled when their client disconnects (``handler_cancellation``): a
  request waiting for its answer is then aborted in the engine (see ``generation``).
* The socket is bound here, not by aiohttp, so ``--port 0`` works (the bound port is
  known before the ready line) and "address in use" becomes one clear error.
* Shutdown: stop accepting connections, give in-flight requests ``grace_s`` to finish,
  abort the rest (their handlers answer with ``finish_reason: abort``), stop the loop.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from fairserve.core.openai_api import ApiError, internal_error
from fairserve.router.server import bind
from fairserve.worker import admin, generation
from fairserve.worker import responses as r
from fairserve.worker.config import WorkerConfig, build_engine
from fairserve.worker.metrics import WorkerMetrics
from fairserve.worker.runtime import EngineFactory, WorkerRuntime

log = logging.getLogger("fairserve.worker")

DEFAULT_GRACE_S = 5.0
MAX_BODY_BYTES = 64 * 1024 * 1024


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every failure leaves as JSON ``{"error": {"message", "type", "code"}}``."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except ApiError as exc:
        return _error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = f"{exc.reason}: {request.method} {request.path}"
        return _error_response(ApiError(exc.status, message))
    except Exception as exc:
        return _error_response(internal_error(log, exc, f"{request.method} {request.path}"))


def _error_response(exc: ApiError) -> web.Response:
    return web.json_response(
        r.error_body(exc), status=exc.status, headers=exc.headers, dumps=r.dumps
    )


def build_app(runtime: WorkerRuntime) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app[generation.RUNTIME] = runtime
    app[admin.METRICS] = WorkerMetrics(runtime)
    routes = [
        web.post("/generate", generation.generate),
        web.post("/v1/completions", generation.completions),
        web.post("/v1/chat/completions", generation.chat_completions),
        web.get("/v1/models", admin.list_models),
        web.get("/health", admin.health),
        web.get("/health_generate", admin.health_generate),
        web.get("/get_server_info", admin.get_server_info),
        web.get("/server_info", admin.get_server_info),
        web.get("/get_model_info", admin.get_model_info),
        web.get("/model_info", admin.get_model_info),
        web.get("/get_load", admin.get_load),
        web.get("/metrics", admin.metrics),
        web.post("/abort_request", admin.abort_request),
        web.post("/flush_cache", admin.flush_cache),
        web.get("/flush_cache", admin.flush_cache),
        *admin.extension_routes(),  # /fairserve/worker/*: the table the SGLang plugin serves
    ]
    app.add_routes(routes)
    return app


class WorkerServer:
    """One simulated worker listening on ``host:port`` (``port`` 0: any free port)."""

    def __init__(
        self,
        config: WorkerConfig,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        engine_factory: EngineFactory = build_engine,
    ) -> None:
        self.config = config
        self.host = host
        self.port = port
        self.grace_s = grace_s
        self._factory = engine_factory
        self.runtime: WorkerRuntime | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.SockSite | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> str:
        """Bind, start the engine loop and serve; returns the URL (with the bound port)."""
        sock = bind(self.host, self.port, role="worker")
        self.port = sock.getsockname()[1]
        self.runtime = WorkerRuntime(self.config, self._factory)
        self.runtime.start()
        app = build_app(self.runtime)
        app[admin.LISTEN_HOST] = self.host  # the admin rule depends on it (api.auth)
        self._runner = web.AppRunner(
            app,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=self.grace_s + 1.0,
        )
        await self._runner.setup()
        self._site = web.SockSite(self._runner, sock)
        await self._site.start()
        return self.url

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (``grace_s``), abort the rest."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        if self.runtime is not None:
            await self.runtime.drain(self.grace_s)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.runtime is not None:
            await self.runtime.stop()

    async def __aenter__(self) -> WorkerServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class _DropMalformedRequests(logging.Filter):
    """aiohttp logs a traceback for every request it cannot parse, though the client already
    got a 400. ``sglang-router`` probes each worker for gRPC with an HTTP/2 preface at
    registration, so every router start would print two tracebacks per worker."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, HttpProcessingError)


def configure_logging() -> None:
    """Process-wide logging for ``fairserve worker``: warnings and errors on stderr, but no
    tracebacks for requests that were malformed on the wire."""
    logging.basicConfig(
        level=logging.WARNING, format="fairserve worker: %(levelname)s: %(message)s"
    )
    logging.getLogger("aiohttp.server").addFilter(_DropMalformedRequests())
