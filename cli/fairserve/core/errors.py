"""Errors raised by the pure layers.

They carry no exit codes: ``fairserve.commands.errors`` maps them to codes and messages in
one place, so the pure layers stay free of CLI concerns.
"""

from __future__ import annotations


class FairserveError(Exception):
    """Base class of every error fairserve raises on purpose (never a bug)."""


class ConfigError(FairserveError, ValueError):
    """A parameter or file value is invalid; the message names the field and what was expected."""


class UnknownNameError(ConfigError, KeyError):
    """A name (policy, dispatcher, client, workload) is not registered.

    Subclasses KeyError for callers that look names up like a mapping, but keeps a readable
    message (KeyError's own ``str`` would add quotes).
    """

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = sorted(known)
        super().__init__(f"unknown {kind} {name!r}; expected one of: {', '.join(self.known)}")

    def __str__(self) -> str:
        return str(self.args[0])


class RequestRejected(FairserveError):
    """A policy refused a request (e.g. the ``rpm`` limit); hosts turn it into HTTP 429.

    ``retry_after_s`` tells the client when a retry can succeed.
    """

    def __init__(self, client: str, reason: str, retry_after_s: float) -> None:
        self.client = client
        self.reason = reason
        self.retry_after_s = retry_after_s
        super().__init__(f"request from client {client!r} rejected: {reason}")
