"""``fairserve top`` as a user starts it: the exit codes before any dashboard appears."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.cli.conftest import run_fairserve


def _top(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    state = {"XDG_STATE_HOME": str(home), "XDG_RUNTIME_DIR": str(home)}
    return run_fairserve("top", *args, env=state, unset=("FAIRSERVE_ADMIN_TOKEN",), module=True)


def test_nothing_running_exits_3(tmp_path: Path) -> None:
    result = _top(home=tmp_path)
    assert result.returncode == 3
    assert "nothing is running" in result.stderr and "fairserve launch" in result.stderr


def test_no_terminal_is_a_usage_error(tmp_path: Path) -> None:
    result = _top("--url", "http://127.0.0.1:9", home=tmp_path)
    assert result.returncode == 2
    assert "needs a terminal" in result.stderr and result.stdout == ""


def test_interval_must_be_positive(tmp_path: Path) -> None:
    result = _top("--url", "http://127.0.0.1:9", "--interval", "0", home=tmp_path)
    assert result.returncode == 2 and "--interval" in result.stderr
