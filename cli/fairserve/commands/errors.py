"""Exit codes and the one place that turns exceptions into them.

Operators script fairserve (``fairserve status || page-someone``), so the exit code is part of
the contract (DESIGN §4): 0 ok, 1 error, 2 usage, 3 unreachable/unavailable, 130 interrupt.
Every command lets its exceptions propagate; :func:`classify` decides the code and the message
here, so no command invents its own codes and the pure layers (``core``, ``sched``) stay free
of CLI concerns. Tracebacks are for developers and appear only with ``--debug``.
"""

from __future__ import annotations

import errno
import socket
import traceback
from dataclasses import dataclass
from enum import IntEnum
from typing import TextIO

from fairserve.core.errors import ConfigError, FairserveError


class ExitCode(IntEnum):
    """The process exit codes of every fairserve command."""

    OK = 0
    ERROR = 1
    USAGE = 2
    UNAVAILABLE = 3
    INTERRUPT = 130

    @property
    def meaning(self) -> str:
        """One line for the man pages' EXIT STATUS section."""
        return _MEANINGS[self]


_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "success",
    ExitCode.ERROR: "the command failed (an error message says why)",
    ExitCode.USAGE: "bad usage: unknown command or option, invalid parameter or name",
    ExitCode.UNAVAILABLE: "a router or worker is unreachable, or no worker is available",
    ExitCode.INTERRUPT: "interrupted (Ctrl-C)",
}

# errno values that mean "the other side is not there", whatever wrapper raised them
# (socket, asyncio, aiohttp's ClientConnectorError all subclass OSError and keep errno).
_UNREACHABLE_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.EHOSTDOWN,
        errno.ENETDOWN,
        errno.ETIMEDOUT,
    }
)


@dataclass(frozen=True, slots=True)
class Failure:
    """What the user sees for an exception: exit code, message, and whether it is a bug."""

    code: ExitCode
    message: str
    internal: bool = False


def classify(exc: BaseException) -> Failure:
    """Map an exception to its exit code and user-facing message.

    Order matters: the most specific classes come first (``UnknownNameError`` is a
    ``ConfigError`` is a ``FairserveError``; ``NoWorkerAvailable`` is a ``FairserveError``).
    """
    # Imported here so that `fairserve --version` does not pay for the scheduling layer.
    from fairserve.sched.dispatch.base import NoWorkerAvailable

    if isinstance(exc, KeyboardInterrupt):
        return Failure(ExitCode.INTERRUPT, "interrupted")
    if isinstance(exc, NoWorkerAvailable):
        return Failure(ExitCode.UNAVAILABLE, str(exc))
    if isinstance(exc, ConfigError):
        return Failure(ExitCode.USAGE, str(exc))
    if isinstance(exc, FairserveError):
        return Failure(ExitCode.ERROR, str(exc))
    if isinstance(exc, OSError):
        # str() is "[Errno 111] Connection refused", or the wrapper's (aiohttp's) own text.
        text = str(exc) or type(exc).__name__
        if _is_unreachable(exc):
            return Failure(ExitCode.UNAVAILABLE, f"unreachable: {text}")
        return Failure(ExitCode.ERROR, text)
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return Failure(ExitCode.ERROR, f"internal error: {detail}", internal=True)


def _is_unreachable(exc: OSError) -> bool:
    if isinstance(exc, ConnectionError | TimeoutError | socket.gaierror):
        return True
    return exc.errno in _UNREACHABLE_ERRNOS


def report(exc: BaseException, *, debug: bool, stderr: TextIO) -> ExitCode:
    """Print the diagnostic for ``exc`` to ``stderr`` and return the exit code to use.

    With ``debug`` the full traceback comes first, so the one-line message stays last and
    visible at the bottom of the terminal; without it, a bug's message says how to get one.
    """
    failure = classify(exc)
    if debug:
        traceback.print_exception(exc, file=stderr)
    if failure.code is ExitCode.INTERRUPT:
        stderr.write("fairserve: interrupted\n")
    else:
        hint = " (rerun with --debug for a traceback)" if failure.internal and not debug else ""
        stderr.write(f"fairserve: error: {failure.message}{hint}\n")
    stderr.flush()
    return failure.code
