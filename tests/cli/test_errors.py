"""The exception → exit-code map, with real exception objects (no mocks)."""

from __future__ import annotations

import asyncio
import errno
import io
import socket
from pathlib import Path

import aiohttp
import pytest

from fairserve.commands.errors import ExitCode, classify, report
from fairserve.core.errors import ConfigError, FairserveError, RequestRejected, UnknownNameError
from fairserve.sched.dispatch.base import NoWorkerAvailable
from fairserve.sched.registry import make_local_policy


def _closed_port() -> int:
    """A local TCP port with nothing listening (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _raised(func: object) -> BaseException:
    assert callable(func)
    with pytest.raises(BaseException) as info:
        func()
    return info.value


def test_exit_codes_are_the_documented_enum() -> None:
    assert {c.name: c.value for c in ExitCode} == {
        "OK": 0,
        "ERROR": 1,
        "USAGE": 2,
        "UNAVAILABLE": 3,
        "INTERRUPT": 130,
    }
    assert all(code.meaning for code in ExitCode)


def test_unknown_policy_name_from_the_registry_is_usage() -> None:
    exc = _raised(lambda: make_local_policy("no-such-policy"))
    assert isinstance(exc, UnknownNameError)
    failure = classify(exc)
    assert failure.code is ExitCode.USAGE
    assert "unknown local policy 'no-such-policy'" in failure.message
    assert "fcfs" in failure.message  # lists what would have been valid


def test_bad_policy_parameter_is_usage() -> None:
    exc = _raised(lambda: make_local_policy("dlpm", quantum=-1))
    assert isinstance(exc, ConfigError)
    failure = classify(exc)
    assert failure.code is ExitCode.USAGE
    assert "quantum" in failure.message


def test_config_error_is_usage_with_its_message() -> None:
    assert classify(ConfigError("bad value")) == classify(ConfigError("bad value"))
    failure = classify(ConfigError("bad value"))
    assert (failure.code, failure.message, failure.internal) == (ExitCode.USAGE, "bad value", False)


def test_fairserve_errors_are_plain_errors() -> None:
    assert classify(FairserveError("it failed")).code is ExitCode.ERROR
    rejected = RequestRejected("alice", "over 60 requests per minute", 3.0)
    failure = classify(rejected)
    assert failure.code is ExitCode.ERROR
    assert "alice" in failure.message


def test_no_worker_available_is_unavailable() -> None:
    failure = classify(NoWorkerAvailable("no healthy worker is available"))
    assert failure.code is ExitCode.UNAVAILABLE


def test_keyboard_interrupt_is_130() -> None:
    assert classify(KeyboardInterrupt()).code is ExitCode.INTERRUPT


def test_real_refused_connection_is_unavailable() -> None:
    port = _closed_port()
    exc = _raised(lambda: socket.create_connection(("127.0.0.1", port), timeout=5))
    assert isinstance(exc, ConnectionRefusedError)
    failure = classify(exc)
    assert failure.code is ExitCode.UNAVAILABLE
    assert failure.message.startswith("unreachable: ")


def test_real_aiohttp_connect_failure_is_unavailable() -> None:
    """What router-facing commands will see when the router is down."""
    port = _closed_port()

    async def get() -> None:
        async with aiohttp.ClientSession() as session:
            await session.get(f"http://127.0.0.1:{port}/health")

    exc = _raised(lambda: asyncio.run(get()))
    assert isinstance(exc, aiohttp.ClientConnectorError)
    assert classify(exc).code is ExitCode.UNAVAILABLE


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.EHOSTUNREACH, "No route to host"),
        OSError(errno.ENETUNREACH, "Network is unreachable"),
        TimeoutError("timed out"),
        socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
    ],
)
def test_unreachable_os_errors_are_unavailable(exc: OSError) -> None:
    assert classify(exc).code is ExitCode.UNAVAILABLE


def test_other_os_errors_are_errors_not_bugs() -> None:
    exc = _raised(Path("/nonexistent/fairserve/file").read_text)
    failure = classify(exc)
    assert (failure.code, failure.internal) == (ExitCode.ERROR, False)
    assert "No such file or directory" in failure.message


def test_unexpected_exceptions_are_internal_errors() -> None:
    empty: dict[str, int] = {}
    exc = _raised(lambda: empty["missing"])
    failure = classify(exc)
    assert failure.code is ExitCode.ERROR
    assert failure.internal
    assert failure.message == "internal error: KeyError: 'missing'"


def test_report_hints_at_debug_only_for_bugs_without_debug() -> None:
    stderr = io.StringIO()
    assert report(ValueError("x"), debug=False, stderr=stderr) is ExitCode.ERROR
    assert stderr.getvalue() == (
        "fairserve: error: internal error: ValueError: x (rerun with --debug for a traceback)\n"
    )
    stderr = io.StringIO()
    assert report(ConfigError("bad"), debug=False, stderr=stderr) is ExitCode.USAGE
    assert stderr.getvalue() == "fairserve: error: bad\n"


def test_report_with_debug_prints_the_traceback_first() -> None:
    try:
        raise ValueError("x")
    except ValueError as caught:
        exc = caught
    stderr = io.StringIO()
    report(exc, debug=True, stderr=stderr)
    text = stderr.getvalue()
    assert text.startswith("Traceback (most recent call last)")
    assert text.endswith("fairserve: error: internal error: ValueError: x\n")


def test_report_interrupt() -> None:
    stderr = io.StringIO()
    assert report(KeyboardInterrupt(), debug=False, stderr=stderr) is ExitCode.INTERRUPT
    assert stderr.getvalue() == "fairserve: interrupted\n"
