"""The run file: XDG locations, mode 0600, round trip, pid-reuse safety."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fairserve.cluster import paths, runfile
from fairserve.cluster.runfile import RunInfo, WorkerEntry
from fairserve.core.errors import FairserveError


def _info(pid: int, create_time: float) -> RunInfo:
    return RunInfo(
        router_url="http://127.0.0.1:8000",
        admin_token="secret",
        supervisor_pid=pid,
        supervisor_create_time=create_time,
        engine="sim",
        policy="dlpm",
        dispatch="doubleq",
        quantum=None,
        worker_quantum=2048.0,
        run_dir="/tmp/x",
        workers=[WorkerEntry("worker-0", "http://127.0.0.1:1", pid=1, log="w.log", restarts=2)],
    )


def test_locations_follow_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert paths.run_file_path() == tmp_path / "run" / "fairserve" / "run.json"
    assert paths.state_dir() == tmp_path / "state" / "fairserve"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/dir")  # XDG: relative paths are ignored
    assert paths.run_file_path() == tmp_path / "state" / "fairserve" / "run.json"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.state_dir() == tmp_path / "home" / ".local" / "state" / "fairserve"


def test_round_trip_with_private_mode() -> None:
    me = os.getpid()
    path = runfile.write(_info(me, runfile.process_create_time(me) or 0.0))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    back = runfile.read()
    assert back == _info(me, back.supervisor_create_time if back else 0.0)
    assert runfile.live_run() == back


def test_dead_or_reused_pid_is_not_live() -> None:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    runfile.write(_info(int(child.stdout), 1.0))
    assert runfile.live_run() is None
    me = os.getpid()
    runfile.write(_info(me, (runfile.process_create_time(me) or 0.0) - 100))  # pid reused
    assert runfile.live_run() is None


def test_remove_respects_a_newer_owner() -> None:
    runfile.write(_info(123, 1.0))
    runfile.remove(owner_pid=456)
    assert runfile.read() is not None
    runfile.remove(owner_pid=123)
    assert runfile.read() is None


def test_corrupt_run_file_names_the_file() -> None:
    path = paths.run_file_path()
    paths.ensure_private_dir(path.parent)
    path.write_text("{not json")
    with pytest.raises(FairserveError, match=r"run\.json: unreadable run file"):
        runfile.read()
