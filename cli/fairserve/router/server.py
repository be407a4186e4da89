"""The router's HTTP servers and lifecycle: bind, serve, drain, stop.

:class:`RouterServer` is what ``fairserve router``, ``launch`` and the tests start, so the
tests exercise the same sockets and shutdown path as production.

* The listening socket belongs to the lean front (:mod:`fairserve.router.front`), which
  serves the generation routes' common case and hands every other connection to the
  aiohttp application (all routes, same handlers); ``RouterConfig.lean_front=False``
  serves everything with aiohttp.

* Requests must arrive in time and connections are capped (``router.guard``, slowloris):
  the front's sweep and aiohttp's keep-alive timeout close connections whose head does not
  arrive, a body read bounded in time answers 408, and ``Expect: 100-continue`` for an
  oversize body gets 413 at once on both paths.
* Handlers are cancelled when their client disconnects (``handler_cancellation``): the
  proxy then aborts the upstream request.
* The socket is bound here, so ``port=0`` works and "address in use" is one clear error.
* ``stop()`` drains: stop accepting (new connections are refused), answer new requests on
  open connections 503 "the router is shutting down" and close them, let in-flight ones
  finish for ``drain_timeout_s``, then end the rest with that error (a 503, or the last
  SSE event of a stream under way) on both paths, and close the upstream session.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket

from aiohttp import web

from fairserve.core.errors import FairserveError
from fairserve.router import guard, handlers
from fairserve.router.config import RouterConfig
from fairserve.router.front import Front
from fairserve.router.guard import ConnectionLimits
from fairserve.router.service import Router

log = logging.getLogger("fairserve.router")


def build_app(
    router: Router,
    url_holder: list[str],
    limits: ConnectionLimits | None = None,
    in_flight: guard.InFlight | None = None,
) -> web.Application:
    limits = limits or ConnectionLimits()
    in_flight = in_flight or guard.InFlight()
    max_body_bytes = router.config.max_body_bytes
    app = web.Application(
        middlewares=[
            in_flight.middleware(),
            handlers.errors,
            guard.body_deadline(limits.idle_timeout_s),
        ],
        client_max_size=max_body_bytes,
    )
    app[handlers.ROUTER] = router
    app[handlers.URL] = url_holder
    expect = guard.expect_within_limit(max_body_bytes)
    app.add_routes(
        web.RouteDef(d.method, d.path, d.handler, {"expect_handler": expect, **d.kwargs})
        for d in handlers.routes()
    )
    return app


class RouterServer:
    """One router listening on ``config.host:config.port`` (port 0: any free port)."""

    def __init__(self, config: RouterConfig, limits: ConnectionLimits | None = None) -> None:
        self.config = config
        self.limits = limits or ConnectionLimits()
        self.in_flight = guard.InFlight()
        self.host = config.host
        self.port = config.port
        self.router = Router(config)
        self._url = [""]
        self._runner: web.AppRunner | None = None
        self._site: web.SockSite | None = None
        self._server: asyncio.AbstractServer | None = None
        self.front: Front | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> str:
        """Probe the workers, bind and serve; returns the URL (with the bound port)."""
        sock = bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._url[0] = self.url
        try:
            await self.router.start()
            self._runner = web.AppRunner(
                build_app(self.router, self._url, self.limits, self.in_flight),
                handler_cancellation=True,
                access_log=None,
                shutdown_timeout=1.0,
                **self.limits.runner_options(),
            )
            await self._runner.setup()
            if self.config.lean_front:
                assert self._runner.server is not None
                self.front = Front(self.router, self._runner.server, self.limits, self.in_flight)
                loop = asyncio.get_running_loop()
                self._server = await loop.create_server(self.front, sock=sock, backlog=1024)
            else:
                self._site = web.SockSite(self._runner, sock)
                await self._site.start()
        except BaseException:
            sock.close()
            await self.router.close()
            raise
        return self.url

    async def stop(self, drain_timeout_s: float | None = None) -> bool:
        """Drain and stop; True when every in-flight request finished in time."""
        timeout = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        self.router.draining = True
        if self._server is not None:
            self._server.close()  # stop accepting; open connections stay
            self._server = None
        if self._site is not None:
            await self._site.stop()
            self._site = None
        drained = await self.router.drain(timeout)
        if self.front is not None:
            self.front.close()
        self.in_flight.end_all()
        await asyncio.sleep(0)  # let the handlers write their last words
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.router.close()
        for up in self.router.upstreams.values():
            if up.pool is not None:
                up.pool.close()
                up.pool = None
        return drained

    async def __aenter__(self) -> RouterServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def bind(host: str, port: int, role: str = "router") -> socket.socket:
    """A listening non-blocking socket for an aiohttp site, or a FairserveError that says
    why not (the router, the simulated worker and ``launch``'s port check share it)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise FairserveError(f"--host {host!r}: cannot resolve: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise FairserveError(
                f"cannot listen on {host}:{port}: address already in use "
                f"(another {role} running? choose another --port)"
            ) from None
        raise FairserveError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock
