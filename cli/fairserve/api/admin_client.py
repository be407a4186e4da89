"""The one client of the router's admin API: state, quanta and weights (``/fairserve/v1``).

``tune`` and ``status`` call it synchronously (:class:`AdminClient`, ``urllib``: short-lived
commands and a tuner that polls every few seconds need no event loop). ``top`` runs on
aiohttp and cannot share the transport, so the rest is pure functions it shares instead:
the query of a state read, the body of a quantum write and the text of a refusal.

Every failure becomes an error that names the router and says what to do:
:class:`RouterUnreachable` (the router did not answer), :class:`AdminRefused` (missing or
wrong admin token, writes disabled), ``ConfigError`` (a value the router rejected: 400).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, cast

from fairserve.api import paths
from fairserve.api.auth import admin_headers
from fairserve.api.jsonsafe import json_safe
from fairserve.api.router_schema import RouterQuantum, RouterState, RouterWeights, WeightResult
from fairserve.core.errors import ConfigError, FairserveError

TIMEOUT_S = 5.0
TOKEN_HINT = "pass --token or set FAIRSERVE_ADMIN_TOKEN (launch keeps it in the run file)"
NOT_A_ROUTER = "is this a fairserve router?"
"""The hint of a 404: the URL answers HTTP but has no admin API."""
MAX_ERROR_CHARS = 200
"""How much of a non-JSON error body a message quotes."""


class RouterUnreachable(FairserveError, ConnectionError):
    """The router did not answer (refused, timed out, no such host): exit 3.

    A ``ConnectionError`` too, so a caller that handles network failures as ``OSError``
    (``status``) keeps doing so; ``reason`` is what urllib said (``[Errno 111] ...``)."""

    def __init__(self, message: str, reason: object = None) -> None:
        super().__init__(message)
        self.reason = reason


class AdminRefused(FairserveError):
    """The router refused an admin write: missing or wrong token, or writes disabled."""


# ------------------------------------------------------------------ pure helpers
def state_query(window_s: float | None = None) -> dict[str, str]:
    """The query string of a state read: fairness over the last ``window_s`` seconds."""
    return {} if window_s is None else {"window_s": f"{window_s:g}"}


def quantum_body(
    quantum: float | None = None, worker_quantum: float | None = None
) -> dict[str, Any]:
    """The body of ``PUT /fairserve/v1/quantum``: Q^u and/or Q^w, infinities as ``"inf"``
    (the JSON rule of :mod:`fairserve.api.jsonsafe`)."""
    body: dict[str, Any] = {}
    if quantum is not None:
        body["quantum"] = quantum
    if worker_quantum is not None:
        body["worker_quantum"] = worker_quantum
    return cast(dict[str, Any], json_safe(body))


def error_message(raw: bytes) -> str | None:
    """The ``error.message`` of an OpenAI-shaped error body; the start of the body when it
    is not JSON; None for JSON without a message."""
    try:
        payload = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")[:MAX_ERROR_CHARS] or None
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None


def status_text(status: int, raw: bytes) -> str:
    """``HTTP 403: wrong admin token``: an error status with the router's message."""
    message = error_message(raw)
    return f"HTTP {status}: {message}" if message else f"HTTP {status}"


def refusal(where: str, status: int, raw: bytes) -> FairserveError:
    """The error for an error status; ``where`` is ``METHOD URL``."""
    message = error_message(raw) or f"HTTP {status}"
    if status == 400:
        return ConfigError(f"the router refused the value: {message}")
    if status == 401:
        return AdminRefused(f"{where}: the admin token is missing: {TOKEN_HINT}")
    if status == 403:
        return AdminRefused(f"{where}: {message}")
    if status == 404:
        return FairserveError(f"{where}: not found ({NOT_A_ROUTER})")
    return FairserveError(f"{where}: {message}")


# ------------------------------------------------------------------ the client
@dataclass(frozen=True)
class AdminClient:
    """One router: its URL (no trailing slash) and, for writes, its admin token."""

    url: str
    token: str | None = None
    timeout_s: float = TIMEOUT_S

    # ------------------------------------------------------------------ reads
    def state(self, window_s: float | None = None) -> RouterState:
        query = urllib.parse.urlencode(state_query(window_s))
        path = paths.ROUTER_STATE + (f"?{query}" if query else "")
        return cast(RouterState, self._object(self._call("GET", path)))

    def quantum(self) -> RouterQuantum:
        return cast(RouterQuantum, self._object(self._call("GET", paths.ROUTER_QUANTUM)))

    def weights(self) -> RouterWeights:
        return cast(RouterWeights, self._object(self._call("GET", paths.ROUTER_WEIGHTS)))

    # ------------------------------------------------------------------ writes
    def set_quantum(
        self, quantum: float | None = None, worker_quantum: float | None = None
    ) -> RouterQuantum:
        """PUT Q^u and/or Q^w; returns the router's new view (with ``worker_errors``)."""
        body = quantum_body(quantum, worker_quantum)
        return cast(RouterQuantum, self._object(self._call("PUT", paths.ROUTER_QUANTUM, body)))

    def set_weight(self, client: str, weight: float) -> WeightResult:
        body = {"client": client, "weight": weight}
        return cast(WeightResult, self._object(self._call("PUT", paths.ROUTER_WEIGHTS, body)))

    def require_token(self, what: str) -> None:
        """Fail before any work when a write will need the admin token and there is none."""
        if not self.token:
            raise ConfigError(f"{what} needs the router's admin token: {TOKEN_HINT}")

    # ------------------------------------------------------------------ plumbing
    def _call(self, method: str, path: str, body: Any = None) -> Any:
        if method != "GET":
            self.require_token(f"changing {path}")
        headers = {"Accept": "application/json", **admin_headers(self.token)}
        data = None
        if body is not None:
            data = json.dumps(body, allow_nan=False).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise refusal(f"{method} {self.url}{path}", exc.code, exc.read()) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise RouterUnreachable(f"router {self.url} is unreachable: {reason}", reason) from None
        except ValueError as exc:
            raise FairserveError(f"{self.url}{path}: the answer is not JSON ({exc})") from None

    def _object(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise FairserveError(f"router {self.url}: expected a JSON object, got {payload!r}")
        return payload
