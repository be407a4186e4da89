"""The fairserve worker extension, served from inside SGLang's scheduler process.

SGLang's own HTTP server runs in another process (its tokenizer manager), which has no
access to the policy living in the scheduler. So the leader scheduler serves the extension
itself, on a side port (``FAIRSERVE_EXTENSION_PORT``), with the standard library's threaded
HTTP server in a daemon thread: no event loop to share with SGLang, nothing to install.

Routes, JSON shapes and the admin rule are the simulated worker's: both serve the one table
of :mod:`fairserve.api.worker_extension` (state, quantum, weights, evictions). A quantum or
weight PUT returns once the leader rank applied it (see :mod:`fairserve.sglang.control`).
Writes need the admin token (``FAIRSERVE_ADMIN_TOKEN``); without one they are open only when
the extension listens on loopback (:mod:`fairserve.api.auth`).

Errors use the OpenAI error shape, like every other fairserve server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

from fairserve.api import worker_extension as api
from fairserve.api.auth import is_loopback_host
from fairserve.api.jsonsafe import dumps
from fairserve.core.openai_api import ApiError, error_body
from fairserve.sglang.control import PolicyChange
from fairserve.sglang.host import PolicyHost

log = logging.getLogger("fairserve.sglang")

APPLY_TIMEOUT_S = 10.0
"""How long a quantum or weight PUT waits for the scheduler's next iteration to apply it."""
ENABLE_HINT = "start SGLang with FAIRSERVE_ADMIN_TOKEN set (fairserve launch --admin-token)"


class ExtensionServer:
    """The side-port HTTP server; ``start()`` binds (port 0: any free port) and serves."""

    def __init__(
        self,
        host: PolicyHost,
        bind_host: str,
        port: int,
        admin_token: str | None = None,
        apply_timeout_s: float = APPLY_TIMEOUT_S,
    ) -> None:
        self.policy_host = host
        self.bind_host = bind_host
        self.port = port
        self.admin_token = admin_token
        self.apply_timeout_s = apply_timeout_s
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.bind_host}:{self.port}"

    def start(self) -> int:
        server = ThreadingHTTPServer((self.bind_host, self.port), _handler_class(self))
        server.daemon_threads = True
        self._server = server
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name="fairserve-extension", daemon=True
        )
        self._thread.start()
        log.info("fairserve extension listening on %s", self.url)
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    # ------------------------------------------------------------ endpoints
    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes
               ) -> tuple[int, Any]:  # fmt: skip
        """(status, JSON payload) for one request, from the shared table."""
        parts = urlsplit(target)
        query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
        request = api.ExtensionRequest(method, parts.path, query, headers, body)
        rule = api.AdminRule(self.admin_token, is_loopback_host(self.bind_host), ENABLE_HINT)
        return api.handle(request, PluginHost(self.policy_host, self.apply_timeout_s), rule)


class PluginHost:
    """A :class:`PolicyHost` as the extension's host. Values are checked here, on the HTTP
    thread (400 at once); changes travel to the scheduler through the control channel and
    the answer waits until the leader rank applied them (503 after ``apply_timeout_s``)."""

    def __init__(self, host: PolicyHost, apply_timeout_s: float) -> None:
        self.host = host
        self.apply_timeout_s = apply_timeout_s

    def state(self) -> dict[str, Any]:
        return self.host.state_json()

    def quantum(self) -> api.QuantumView:
        return cast(api.QuantumView, self.host.quantum_json())

    def set_quantum(self, quantum: float) -> api.QuantumView:
        value = self.host.check_quantum(quantum)
        self._wait(self.host.controls.submit(value), f"quantum {value:g}")
        return self.quantum()

    def weights(self) -> api.WeightsView:
        return cast(api.WeightsView, self.host.weights_json())

    def set_weight(self, client: str, weight: float) -> api.WeightsView:
        value = self.host.check_weight(client, weight)
        change = self.host.controls.submit_weight(client, value)
        self._wait(change, f"weight {value:g} of client {client!r}")
        return self.weights()

    def evictions(self, since: int, limit: int) -> api.EvictionPage:
        return cast(api.EvictionPage, self.host.evictions.read(since, limit))

    def _wait(self, submitted: tuple[PolicyChange, threading.Event], what: str) -> None:
        message, applied = submitted
        if not applied.wait(self.apply_timeout_s):
            self.host.controls.forget(message)
            raise ApiError(
                503,
                f"the scheduler did not apply {what} within {self.apply_timeout_s:g} s "
                "(busy?); it applies at its next iteration",
            )


def _handler_class(server: ExtensionServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "fairserve-sglang-extension"

        def do_GET(self) -> None:
            self._serve("GET")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_DELETE(self) -> None:  # 405 or 404 from the table, as aiohttp answers
            self._serve("DELETE")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def _serve(self, method: str) -> None:
            try:
                body = self._body()
                headers = {name.title(): value for name, value in self.headers.items()}
                status, payload = server.handle(method, self.path, headers, body)
            except ApiError as exc:
                status, payload = exc.status, error_body(exc)
            except Exception as exc:  # never kill the scheduler over a dashboard request
                log.exception("fairserve extension: %s %s failed", method, self.path)
                error = ApiError(500, f"internal error: {type(exc).__name__}")
                status, payload = 500, error_body(error)
            data = dumps(payload).encode()
            self.send_response(status, HTTPStatus(status).phrase)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            text = self.headers.get("Content-Length") or "0"
            if not (text.isascii() and text.isdigit()):
                self.close_connection = True  # the body's end is unknown
                message = f"Content-Length: expected a non-negative integer, got {text!r}"
                raise ApiError(400, message)
            length = int(text)
            if length > api.MAX_BODY_BYTES:
                self.close_connection = True
                raise api.body_too_large(length)
            return self.rfile.read(length) if length else b""

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("fairserve extension: " + format, *args)

    return Handler
