"""Who is calling: the client a request is charged to, and the application it belongs to.

Threat model (issue 18): any client can send any header and body, so an identity that
decides weights and shares must be one a client cannot claim. Three modes
(:func:`auth_mode`, shown in ``/fairserve/v1/state`` and by ``fairserve status``):

``api-key`` (a clients file): the API key (``Authorization: Bearer``) is the identity
    and is required: no key is 401, a key the file does not list is 401 (a typo must not
    silently turn a tenant into someone else). Header and ``user`` are ignored.
``api-key+trusted-header`` (a clients file and ``--trust-identity-header``, for a gateway
    in front that authenticates): a key still wins; without one, the
    ``X-Fairserve-Client`` header, then the OpenAI ``user`` field, else ``anonymous``.
    Such a name may never be a keyed client's: 403.
``open`` (no clients file): the header, then ``user``, else ``anonymous``; keys are not
    checked (OpenAI SDKs always send some key, often ``EMPTY``).

Names are 1 to 64 characters from ``A-Z a-z 0-9 . _ : @ / -`` (400 otherwise): no
control bytes, no lone surrogates, nothing a Prometheus label or a log line chokes on.

Request ids (:func:`upstream_rid`): the worker aborts and deduplicates by rid, so the rid
sent upstream is the router's own, one no other client can name: a client cannot abort
(by sending it and resetting its connection) or pre-book another tenant's request.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from fairserve.api.auth import bearer_token
from fairserve.core.openai_api import APP_HEADER, CLIENT_HEADER, ApiError, bad_request
from fairserve.core.types import ANONYMOUS_CLIENT
from fairserve.router.config import ClientEntry

AuthMode = Literal["api-key", "api-key+trusted-header", "open"]

MAX_NAME_CHARS = 64
MAX_APP_CHARS = 128
"""Application names are ``CLIENT/pN`` and the like: a client name and a suffix."""
NAME_CHARS = "A-Z a-z 0-9 . _ : @ / -"
_NAME = re.compile(r"[A-Za-z0-9._:@/-]+")
_KNOWN_NAMES_MAX = 4096
_known_names: set[str] = set()
"""Names already checked (the hot path: most requests repeat a few names); emptied when
full, so 100,000 distinct names cost no more than a re-check each."""


def auth_mode(keys: Mapping[str, ClientEntry], trust_header: bool) -> AuthMode:
    """Which identities a router honours (see the module docstring)."""
    if not keys:
        return "open"
    return "api-key+trusted-header" if trust_header else "api-key"


def identify(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    keys: Mapping[str, ClientEntry],
    trust_header: bool = False,
) -> str:
    """The client a request is charged to. Raises 401 for a missing key (``api-key``
    mode) or an unknown one, 403 for a name claiming a keyed client, 400 for a bad
    header or ``user`` value."""
    keyed = authenticate(headers, keys, trust_header)
    return keyed if keyed is not None else claimed_client(headers, body, keys)


def authenticate(
    headers: Mapping[str, str], keys: Mapping[str, ClientEntry], trust_header: bool = False
) -> str | None:
    """The keyed client a request's API key names, from its head alone, so a request is
    refused (401: no key in ``api-key`` mode, or an unknown key) before its body is read
    and an unauthenticated client learns nothing of how its body would be judged. None
    where the name comes from the request (no clients file, or a trusted header without a
    key: :func:`claimed_client`)."""
    if not keys:
        return None
    token = bearer_token(headers)
    if token is not None:
        entry = keys.get(token)
        if entry is None:
            raise ApiError(
                401,
                "unknown API key: the Authorization bearer token is not in the clients file",
                code="invalid_api_key",
            )
        return entry.name
    if not trust_header:
        raise ApiError(
            401,
            "API key required: send 'Authorization: Bearer KEY' with a key from the "
            "router's clients file",
            code="invalid_api_key",
        )
    return None


def claimed_client(
    headers: Mapping[str, str], body: Mapping[str, Any], keys: Mapping[str, ClientEntry]
) -> str:
    """The name a request without an API key gives itself; 403 where it names a keyed
    client (only its key may act as it)."""
    name = _claimed(headers, body)
    if keys and any(entry.name == name for entry in keys.values()):
        raise ApiError(
            403,
            f"client {name!r} is a client of the clients file: send its API key to act as it",
        )
    return name


def _claimed(headers: Mapping[str, str], body: Mapping[str, Any]) -> str:
    """The name a request gives itself: the header, then ``user``, else ``anonymous``."""
    header = headers.get(CLIENT_HEADER)
    if header is not None:
        if header in _known_names:  # checked before, and stripped already
            return header
        return _name(header.strip(), CLIENT_HEADER, MAX_NAME_CHARS)
    user = body.get("user")
    if user is not None:
        if not isinstance(user, str):
            raise bad_request(f"user: expected a string, got {type(user).__name__}")
        if user:
            return _name(user, "user", MAX_NAME_CHARS)
    return ANONYMOUS_CLIENT


def application(headers: Mapping[str, str]) -> str | None:
    """The ``X-Fairserve-App`` header: calls that belong to one application (Justitia)."""
    app = headers.get(APP_HEADER)
    if app is None:
        return None
    app = app.strip()
    return _name(app, APP_HEADER, MAX_APP_CHARS) if app else None


def check_client_name(value: str, where: str) -> str:
    """``value`` if a request could carry it as its client name, else 400: a weight set
    live for a name no request can carry would never apply, yet reach every worker (names
    from a clients file are the router's own and need no check)."""
    return _checked(value, where, MAX_NAME_CHARS)


def _name(value: str, where: str, limit: int) -> str:
    """A name a request gives itself, checked; a client name is remembered as checked."""
    _checked(value, where, limit)
    if limit == MAX_NAME_CHARS:
        if len(_known_names) >= _KNOWN_NAMES_MAX:
            _known_names.clear()
        _known_names.add(value)
    return value


def _checked(value: str, where: str, limit: int) -> str:
    """The one rule for client and application names: 1 to ``limit`` characters from
    :data:`NAME_CHARS`, else 400."""
    if not value:
        raise bad_request(f"{where}: expected a non-empty client name")
    if len(value) > limit or not _NAME.fullmatch(value):
        what = "a client name" if limit == MAX_NAME_CHARS else "an application name"
        shown = ascii(value[: limit + 1])
        raise bad_request(
            f"{where}: {what} is 1 to {limit} characters from {NAME_CHARS}; got {shown}"
        )
    return value


# ------------------------------------------------------------------ request ids
_RID_KEY = os.urandom(32)
"""Drawn once per router process: keys the hash that namespaces a client's own rid."""
_RIDS_PER_DRAW = 256
"""Random rids drawn from the OS per system call (one call per request cost ~1 us)."""
_random_rids: list[str] = []


def upstream_rid(client: str, client_rid: str | None) -> str:
    """The rid the router sends upstream (and aborts by): 32 hex digits nobody else can name.

    Without a client rid: 128 random bits, so no answer's id reveals a sequence to predict
    the next tenant's rid from. With one: a keyed hash of the client's name and its rid,
    so the same client naming the same rid twice gets the same id (SGLang refuses the
    second while the first runs: the client's own problem) but no other client can reach,
    abort or pre-book it. A client's rid is never forwarded as it is."""
    if client_rid is None:
        if not _random_rids:
            block = os.urandom(16 * _RIDS_PER_DRAW).hex()
            _random_rids.extend([block[i : i + 32] for i in range(0, len(block), 32)])
        return _random_rids.pop()
    text = f"{client}\0{client_rid}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(text, key=_RID_KEY, digest_size=16).hexdigest()
