"""Who is calling: the client a request is charged to, and the application it belongs to.

First that applies (DESIGN §5): an API key (``Authorization: Bearer``) from the clients
file; the ``X-Fairserve-Client`` header; the OpenAI ``user`` field; else ``anonymous``.
With a clients file, a key it does not list is refused (401): a typo must not silently
turn a tenant into ``anonymous``. Without one, keys are not checked (OpenAI SDKs always
send some key, often ``EMPTY``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

from fairserve.core.openai_api import APP_HEADER, CLIENT_HEADER, ApiError, bad_request
from fairserve.core.types import ANONYMOUS_CLIENT
from fairserve.router.config import ClientEntry

MAX_NAME_CHARS = 200


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


def identify(
    headers: Mapping[str, str], body: Mapping[str, Any], keys: Mapping[str, ClientEntry]
) -> str:
    """The client a request is charged to (raises 401 for an unknown key, 400 for a bad
    header or ``user`` value)."""
    token = bearer_token(headers)
    if token is not None and keys:
        entry = keys.get(token)
        if entry is None:
            raise ApiError(
                401,
                "unknown API key: the Authorization bearer token is not in the clients file",
                code="invalid_api_key",
            )
        return entry.name
    header = headers.get(CLIENT_HEADER)
    if header is not None:
        return _name(header.strip(), CLIENT_HEADER)
    user = body.get("user")
    if user is not None:
        if not isinstance(user, str):
            raise bad_request(f"user: expected a string, got {type(user).__name__}")
        if user:
            return _name(user, "user")
    return ANONYMOUS_CLIENT


def application(headers: Mapping[str, str]) -> str | None:
    """The ``X-Fairserve-App`` header: calls that belong to one application (Justitia)."""
    app = headers.get(APP_HEADER)
    if app is None:
        return None
    app = app.strip()
    return _name(app, APP_HEADER) if app else None


def _name(value: str, where: str) -> str:
    if not value:
        raise bad_request(f"{where}: expected a non-empty client name")
    if len(value) > MAX_NAME_CHARS:
        raise bad_request(f"{where}: expected at most {MAX_NAME_CHARS} characters")
    return value


# ------------------------------------------------------------------ request ids
_RID_KEY = os.urandom(32)
"""Drawn once per router process: keys the hash that namespaces a client's own rid."""


def upstream_rid(client: str, client_rid: str | None) -> str:
    """The rid the router sends upstream (and aborts by): 32 hex digits nobody else can name.

    Without a client rid: 128 random bits, so no answer's id reveals a sequence to predict
    the next tenant's rid from. With one: a keyed hash of the client's name and its rid,
    so the same client naming the same rid twice gets the same id (SGLang refuses the
    second while the first runs: the client's own problem) but no other client can reach,
    abort or pre-book it. A client's rid is never forwarded as it is."""
    if client_rid is None:
        return os.urandom(16).hex()
    text = f"{client}\0{client_rid}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(text, key=_RID_KEY, digest_size=16).hexdigest()
