"""A simulated worker that believes it listens beyond loopback, for the admin-rule tests.

The rule of ``fairserve.api.auth`` depends on the address a worker listens on; the tests
never listen beyond 127.0.0.1, so the worker's application is told ``0.0.0.0`` while its
socket stays on loopback. Without ``handler_cancellation`` (as in SGLang), a request whose
client left ends only through ``/abort_request``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from fairserve.router.server import bind
from fairserve.worker import admin
from fairserve.worker.config import WorkerConfig, build_engine
from fairserve.worker.runtime import WorkerRuntime
from fairserve.worker.server import build_app


@asynccontextmanager
async def serving_beyond_loopback(config: WorkerConfig) -> AsyncIterator[tuple[str, WorkerRuntime]]:
    """The worker's URL (on 127.0.0.1) and its runtime."""
    runtime = WorkerRuntime(config, build_engine)
    runtime.start()
    app = build_app(runtime)
    app[admin.LISTEN_HOST] = "0.0.0.0"
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = bind("127.0.0.1", 0, role="worker")
    await web.SockSite(runner, sock).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", runtime
    finally:
        await runner.cleanup()
        await runtime.stop()
