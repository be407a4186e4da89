"""The fairserve worker extension, served from inside SGLang's scheduler process.

SGLang's own HTTP server runs in another process (its tokenizer manager), which has no
access to the policy living in the scheduler. So the leader scheduler serves the extension
itself, on a side port (``FAIRSERVE_EXTENSION_PORT``), with the standard library's threaded
HTTP server in a daemon thread: no event loop to share with SGLang, nothing to install.

Endpoints and JSON shapes are the simulated worker's (DESIGN §5):

* ``GET /fairserve/worker/state`` — policy snapshot, counters, per-client queues;
* ``GET /fairserve/worker/quantum``, ``PUT`` ``{"quantum": Q}`` (admin token when set) —
  the PUT returns once every rank applied it (see :mod:`fairserve.sglang.control`);
* ``GET /fairserve/worker/evictions?since=N&limit=M`` — the eviction feed.

Errors use the OpenAI error shape, like every other fairserve server.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fairserve.core.errors import ConfigError
from fairserve.core.openai_api import ApiError, bad_request, error_body
from fairserve.sglang.host import PolicyHost

log = logging.getLogger("fairserve.sglang")

APPLY_TIMEOUT_S = 10.0
"""How long a quantum PUT waits for the scheduler's next iteration to apply it."""
MAX_BODY_BYTES = 1 << 16
DEFAULT_PAGE = 1000

STATE = "/fairserve/worker/state"
QUANTUM = "/fairserve/worker/quantum"
EVICTIONS = "/fairserve/worker/evictions"


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
    def handle(self, method: str, target: str, headers: Any, body: bytes) -> tuple[int, Any]:
        """(status, JSON payload) for one request; raises ApiError for client errors."""
        parts = urlsplit(target)
        path, query = parts.path.rstrip("/") or "/", parse_qs(parts.query)
        routes = {
            ("GET", STATE): lambda: self.policy_host.state_json(),
            ("GET", QUANTUM): lambda: self.policy_host.quantum_json(),
            ("PUT", QUANTUM): lambda: self._put_quantum(headers, body),
            ("GET", EVICTIONS): lambda: self._evictions(query),
        }
        route = routes.get((method, path))
        if route is None:
            if any(p == path for _, p in routes):
                raise ApiError(405, f"{method} is not allowed on {path}")
            raise ApiError(404, f"no such endpoint: {path}")
        return 200, route()

    def _put_quantum(self, headers: Any, body: bytes) -> dict[str, Any]:
        self._check_admin(headers.get("Authorization", ""))
        try:
            data = json.loads(body or b"{}")
        except json.JSONDecodeError as exc:
            raise bad_request(f"body: expected a JSON object ({exc})") from None
        if not isinstance(data, dict):
            raise bad_request('body: expected a JSON object like {"quantum": 256}')
        try:
            quantum = self.policy_host.check_quantum(data.get("quantum"))
        except ConfigError as exc:
            raise bad_request(str(exc)) from None
        message, applied = self.policy_host.controls.submit(quantum)
        if not applied.wait(self.apply_timeout_s):
            self.policy_host.controls.forget(message)
            raise ApiError(
                503,
                f"the scheduler did not apply quantum {quantum:g} within "
                f"{self.apply_timeout_s:g} s (busy?); it applies at its next iteration",
            )
        return self.policy_host.quantum_json()

    def _evictions(self, query: dict[str, list[str]]) -> dict[str, Any]:
        since = _query_int(query, "since", 0)
        limit = _query_int(query, "limit", DEFAULT_PAGE)
        if limit < 1:
            raise bad_request(f"limit: expected a positive integer, got {limit}")
        return self.policy_host.evictions.read(since, limit)

    def _check_admin(self, given: str) -> None:
        if self.admin_token is None:
            return
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            value.strip().encode(), self.admin_token.encode()
        ):
            raise ApiError(401, "admin token required: send 'Authorization: Bearer TOKEN'")


def json_safe(value: Any) -> Any:
    """NaN and infinities (an infinite quantum) become null: they are not JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _query_int(query: dict[str, list[str]], name: str, default: int) -> int:
    values = query.get(name)
    if not values:
        return default
    text = values[-1]
    if not text.isdigit():
        raise bad_request(f"{name}: expected a non-negative integer, got {text!r}")
    return int(text)


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

        def _serve(self, method: str) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    raise ApiError(413, f"body larger than {MAX_BODY_BYTES} bytes")
                body = self.rfile.read(length) if length else b""
                status, payload = server.handle(method, self.path, self.headers, body)
            except ApiError as exc:
                status, payload = exc.status, error_body(exc)
            except Exception as exc:  # never kill the scheduler over a dashboard request
                log.exception("fairserve extension: %s %s failed", method, self.path)
                error = ApiError(500, f"internal error: {type(exc).__name__}: {exc}")
                status, payload = 500, error_body(error)
            data = json.dumps(json_safe(payload), allow_nan=False).encode()
            self.send_response(status, HTTPStatus(status).phrase)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("fairserve extension: " + format, *args)

    return Handler
