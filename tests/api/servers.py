"""Extension hosts for the api tests: the SGLang plugin's extension server driven by a
stand-in for the leader scheduler's iterations, and a simulated worker that believes it
listens beyond loopback.

The rule of ``fairserve.api.auth`` depends on the address a worker listens on; the tests
never listen beyond 127.0.0.1, so the worker's application is told ``0.0.0.0`` while its
socket stays on loopback. Without ``handler_cancellation`` (as in SGLang), a request whose
client left ends only through ``/abort_request``.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from aiohttp import web

from fairserve.router.server import bind
from fairserve.sglang import hooks
from fairserve.sglang.extension import ExtensionServer
from fairserve.sglang.host import PolicyHost
from fairserve.worker import admin
from fairserve.worker.config import WorkerConfig, build_engine
from fairserve.worker.runtime import WorkerRuntime
from fairserve.worker.server import build_app
from tests.sglang.conftest import make_host


@contextmanager
def sglang_extension(token: str | None, quantum: float) -> Iterator[tuple[str, PolicyHost]]:
    """The plugin's extension server on 127.0.0.1 over a real ``PolicyHost`` (dlpm, fed by
    SGLang-shaped fakes) and a thread running the leader scheduler's iterations, which carry
    quantum and weight changes to the policy."""
    host = make_host("dlpm", quantum=quantum)
    hooks.install_host(host)
    server = ExtensionServer(host, "127.0.0.1", 0, admin_token=token, apply_timeout_s=5)
    stop = threading.Event()

    def iterations() -> None:  # poll (send the changes), then process the inputs
        while not stop.wait(0.005):
            hooks.apply_controls(object(), hooks.leader_poll([], object()) or [])

    loop = threading.Thread(target=iterations, name="scheduler", daemon=True)
    server.start()
    loop.start()
    try:
        yield server.url, host
    finally:
        stop.set()
        loop.join(timeout=10)
        server.stop()
        hooks.install_host(None)


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
