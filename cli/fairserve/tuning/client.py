"""The router's admin API as the tuner sees it: state, quanta and weights over HTTP.

Standard library only (``urllib``): the commands that use it are short-lived and
synchronous, and the auto-tuner polls every few seconds. Every failure becomes an error that
names the router and says what to do: :class:`RouterUnreachable` (exit 3), a refused admin
token (:class:`AdminRefused`), a value the router rejected (``ConfigError``, exit 2).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from fairserve.cluster import runfile
from fairserve.cluster.errors import NotRunning
from fairserve.cluster.paths import run_file_path
from fairserve.core.errors import ConfigError, FairserveError

STATE_PATH = "/fairserve/v1/state"
QUANTUM_PATH = "/fairserve/v1/quantum"
WEIGHTS_PATH = "/fairserve/v1/weights"
TIMEOUT_S = 5.0
TOKEN_HINT = "pass --token or set FAIRSERVE_ADMIN_TOKEN (launch keeps it in the run file)"


class RouterUnreachable(FairserveError):
    """The router did not answer (refused, timed out, no such host): exit 3."""


class AdminRefused(FairserveError):
    """The router refused an admin write: missing or wrong token, or writes disabled."""


@dataclass(frozen=True)
class RouterClient:
    """One router: its URL and, for writes, its admin token."""

    url: str
    token: str | None = None
    timeout_s: float = TIMEOUT_S

    # ------------------------------------------------------------------ reads
    def state(self) -> dict[str, Any]:
        return self._dict(self._call("GET", STATE_PATH))

    def quantum(self) -> dict[str, Any]:
        return self._dict(self._call("GET", QUANTUM_PATH))

    def weights(self) -> dict[str, Any]:
        return self._dict(self._call("GET", WEIGHTS_PATH))

    # ------------------------------------------------------------------ writes
    def set_quantum(
        self, quantum: float | None = None, worker_quantum: float | None = None
    ) -> dict[str, Any]:
        """PUT Q^u and/or Q^w; returns the router's new view (with ``worker_errors``)."""
        body: dict[str, Any] = {}
        if quantum is not None:
            body["quantum"] = quantum
        if worker_quantum is not None:
            body["worker_quantum"] = "inf" if math.isinf(worker_quantum) else worker_quantum
        return self._dict(self._call("PUT", QUANTUM_PATH, body))

    def set_weight(self, client: str, weight: float) -> dict[str, Any]:
        return self._dict(self._call("PUT", WEIGHTS_PATH, {"client": client, "weight": weight}))

    def require_token(self, what: str) -> None:
        """Fail before any work when a write will need the admin token and there is none."""
        if not self.token:
            raise ConfigError(f"{what} needs the router's admin token: {TOKEN_HINT}")

    # ------------------------------------------------------------------ plumbing
    def _call(self, method: str, path: str, body: Any = None) -> Any:
        if method != "GET":
            self.require_token(f"changing {path}")
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body, allow_nan=False).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise self._refusal(method, path, exc.code, exc.read()) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise RouterUnreachable(f"router {self.url} is unreachable: {reason}") from None
        except ValueError as exc:
            raise FairserveError(f"{self.url}{path}: the answer is not JSON ({exc})") from None

    def _refusal(self, method: str, path: str, status: int, raw: bytes) -> FairserveError:
        message = _error_message(raw) or f"HTTP {status}"
        where = f"{method} {self.url}{path}"
        if status == 400:
            return ConfigError(f"the router refused the value: {message}")
        if status == 401:
            return AdminRefused(f"{where}: the admin token is missing: {TOKEN_HINT}")
        if status == 403:
            return AdminRefused(f"{where}: {message}")
        if status == 404:
            return FairserveError(f"{where}: not found (is this a fairserve router?)")
        return FairserveError(f"{where}: {message}")

    def _dict(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise FairserveError(f"router {self.url}: expected a JSON object, got {payload!r}")
        return payload


def _error_message(raw: bytes) -> str | None:
    """The ``error.message`` of an OpenAI-shaped error body, if that is what it is."""
    try:
        payload = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")[:200] or None
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None


def connect(url: str | None, token: str | None, timeout_s: float = TIMEOUT_S) -> RouterClient:
    """The router given with ``--url``, else the one in the run file ``launch`` wrote (with
    its admin token unless ``--token`` overrides it); :class:`NotRunning` when neither."""
    if url is not None:
        return RouterClient(url.rstrip("/"), token, timeout_s)
    info = runfile.live_run()
    if info is None:
        raise NotRunning(
            f"nothing is running (no live run file at {run_file_path()}): start it with "
            "fairserve launch, or give the router with --url"
        )
    return RouterClient(info.router_url.rstrip("/"), token or info.admin_token, timeout_s)
