"""The entry point: version, help, usage errors and exit codes through the real app."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest

import fairserve
from fairserve.commands.app import run
from fairserve.commands.errors import ExitCode
from fairserve.core.errors import ConfigError, UnknownNameError
from fairserve.sched.dispatch.base import NoWorkerAvailable
from tests.cli.conftest import REPO, RunCli, run_fairserve


def test_version_from_console_script(run_cli: RunCli) -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout == f"fairserve {fairserve.__version__}\n"
    assert result.stderr == ""


def test_version_from_python_m() -> None:
    result = run_fairserve("--version", module=True, cwd=REPO)
    assert (result.returncode, result.stdout) == (0, f"fairserve {fairserve.__version__}\n")


def test_version_stays_cheap() -> None:
    """--version and --help must not load the scheduling layer or rich (start-up time)."""
    probe = (
        "import sys\n"
        "from fairserve.commands.app import run\n"
        "assert run(['--version']) == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'rich', 'numpy'}"
        " or m.startswith('fairserve.sched')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.splitlines()[-1] == "[]"


def test_package_version_matches_distribution_metadata() -> None:
    assert fairserve.__version__ == version("fairserve")


def test_help_lists_commands_on_stdout(run_cli: RunCli) -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    assert "policies" in result.stdout
    assert "--debug" in result.stdout


def test_unknown_command_is_a_usage_error(run_cli: RunCli) -> None:
    result = run_cli("no-such-command")
    assert result.returncode == ExitCode.USAGE
    assert result.stdout == ""
    assert "no-such-command" in result.stderr


def test_unknown_option_is_a_usage_error(run_cli: RunCli) -> None:
    result = run_cli("policies", "--no-such-option")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "--no-such-option" in result.stderr


def test_no_command_prints_help_and_exits_2(run_cli: RunCli) -> None:
    result = run_cli()
    assert result.returncode == 2
    assert "policies" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("exc", "code", "message"),
    [
        (ConfigError("policy dlpm: parameter 'quantum' must be > 0"), 2, "must be > 0"),
        (UnknownNameError("local policy", "nope", ["fcfs"]), 2, "unknown local policy 'nope'"),
        (NoWorkerAvailable("no healthy worker is available"), 3, "no healthy worker"),
        (ConnectionRefusedError(111, "Connection refused"), 3, "Connection refused"),
        (RuntimeError("boom"), 1, "internal error: RuntimeError: boom (rerun with --debug"),
    ],
)
def test_command_failures_map_to_exit_codes(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    exc: BaseException,
    code: int,
    message: str,
) -> None:
    """An exception escaping a real command reaches the one mapping, with no traceback."""

    def fail() -> None:
        raise exc

    monkeypatch.setattr("fairserve.sched.registry.describe_all", fail)
    assert run(["policies", "--json"]) == code
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err
    assert err.startswith("fairserve: error: ")
    assert "Traceback" not in err


def test_debug_flag_adds_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("fairserve.sched.registry.describe_all", fail)
    assert run(["--debug", "policies"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.rstrip().endswith("fairserve: error: internal error: RuntimeError: boom")


def test_debug_from_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("fairserve.sched.registry.describe_all", fail)
    monkeypatch.setenv("FAIRSERVE_DEBUG", "1")
    assert run(["policies"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_keyboard_interrupt_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupt() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("fairserve.sched.registry.describe_all", interrupt)
    assert run(["policies"]) == ExitCode.INTERRUPT
    assert capsys.readouterr().out == ""
