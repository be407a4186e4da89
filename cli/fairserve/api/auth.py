"""One admin rule for the router, the simulated worker and the SGLang extension.

Writes (``PUT`` of quanta and weights; on a worker also ``/abort_request`` and
``/flush_cache``) change how a shared service treats every tenant, so:

* with an admin token configured, a write needs ``Authorization: Bearer TOKEN``:
  **401** when the header is missing (or not a bearer token), **403** when the token is
  wrong (compared in constant time);
* without a token, a server that listens on loopback only accepts writes (only local
  processes reach it: a developer's single-machine setup); a server that listens beyond
  loopback refuses them with **403** (anyone on the network could reach it). The router
  refuses writes without a token wherever it listens (``open_when_unset=False``);
* reads (state, quantum, weights) stay open; a worker's eviction feed, which carries the
  prefixes of every tenant's prompts, follows the write rule (the router sends the token).

Errors are :class:`~fairserve.core.openai_api.ApiError`, which every server answers in the
OpenAI error shape (``authentication_error`` for 401, ``permission_error`` for 403).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping

from fairserve.core.openai_api import ApiError

MISSING_TOKEN = "admin token required: send 'Authorization: Bearer TOKEN'"
WRONG_TOKEN = "wrong admin token"


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of ``Authorization: Bearer TOKEN``, or None without one."""
    value = headers.get("Authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def admin_headers(token: str | None) -> dict[str, str]:
    """The header that carries ``token`` on a write (none without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def is_loopback_host(host: str) -> bool:
    """Whether a listening address reaches this machine only (``127.0.0.0/8``, ``::1``,
    ``localhost``); a wildcard (``0.0.0.0``, ``::``), a name or any other address does not."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def require_admin(
    headers: Mapping[str, str], token: str | None, *, open_when_unset: bool, enable_hint: str
) -> None:
    """Raise the 401/403 of the rule above unless the request may write.

    ``open_when_unset``: writes are allowed when no token is configured (a worker listening
    on loopback only); ``enable_hint`` ends the 403 without a token and says how to enable
    writes (``"start the router with --admin-token"``)."""
    if token is None:
        if open_when_unset:
            return
        raise ApiError(403, f"writes are disabled: {enable_hint}", "permission_error")
    given = bearer_token(headers)
    if given is None:
        raise ApiError(401, MISSING_TOKEN, "authentication_error")
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise ApiError(403, WRONG_TOKEN, "permission_error")
