"""``fairserve launch``, ``status`` and ``stop`` as a user runs them: real processes on
127.0.0.1, private XDG directories, every wait bounded.

The long test is the user's story end to end (detach, serve, status, a worker killed and
restarted, stop, nothing left); the short ones are the mistakes users make, each of which
must give a clear message, the right exit code, and leave nothing running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.cli.conftest import RunCli
from tests.worker.helpers import write_profile
from tests.worker.processes import free_port, http_json

COMPLETION = {"prompt": "hello fair world", "max_tokens": 4}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "run").mkdir()
    return {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}


def leftovers(env: dict[str, str]) -> list[psutil.Process]:
    """Live processes started with this test's private state directory in their environment:
    exactly the processes a launch in this test could have left behind."""
    found = []
    for proc in psutil.process_iter():
        try:
            ours = proc.environ().get("XDG_STATE_HOME") == env["XDG_STATE_HOME"]
            if ours and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _status(run_cli: RunCli, env: dict[str, str]) -> dict[str, Any]:
    result = run_cli("status", "--json", env=env)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _wait_restarted(run_cli: RunCli, env: dict[str, str], old_pid: int) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        worker = _status(run_cli, env)["workers"][0]
        if worker["restarts"] >= 1 and worker["healthy"] and worker["pid"] not in (None, old_pid):
            return worker
        time.sleep(0.2)
    raise AssertionError("the killed worker was not restarted within 20 s")


def test_detach_serve_restart_stop(run_cli: RunCli, env: dict[str, str], tmp_path: Path) -> None:
    profile = str(write_profile(tmp_path))
    started = time.monotonic()
    launched = run_cli("launch", "--detach", "--port", "0", "--speed", "50",
                       "--profile", profile, env=env)  # fmt: skip
    try:
        assert launched.returncode == 0, launched.stderr
        assert "no NVIDIA GPU" in launched.stderr or "sim" in launched.stderr
        url = launched.stdout.strip()
        status, answer = http_json(url + "/v1/completions", COMPLETION)
        first_request_s = time.monotonic() - started
        assert status == 200 and answer["usage"]["completion_tokens"] == 4
        print(f"\nlaunch --detach to first served request: {first_request_s:.2f} s")

        data = _status(run_cli, env)
        assert data["router"]["url"] == url and data["router"]["policy"] == "dlpm"
        assert data["router"]["dispatch"] == "doubleq" and data["engine"] == "sim"
        workers = data["workers"]
        assert len(workers) == 2 and all(w["healthy"] and w["restarts"] == 0 for w in workers)
        run_file = Path(data["run_file"])
        assert run_file.stat().st_mode & 0o777 == 0o600
        assert json.loads(run_file.read_text())["admin_token"]

        again = run_cli("launch", "--detach", "--port", "0", env=env)
        assert again.returncode == 1 and "already running" in again.stderr

        victim = workers[0]["pid"]
        psutil.Process(victim).kill()
        restarted = _wait_restarted(run_cli, env, victim)
        assert restarted["url"] == workers[0]["url"]
        log = Path(restarted["log"]).parent / "supervisor.log"
        assert "worker-0: restarted" in log.read_text()
        for _ in range(4):
            status, _ = http_json(url + "/v1/completions", COMPLETION)
            assert status == 200

        pids = [data["supervisor_pid"], restarted["pid"], workers[1]["pid"]]
        stopped = run_cli("stop", env=env)
        assert stopped.returncode == 0, stopped.stderr
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                       for p in pids)  # fmt: skip
        assert not run_file.exists() and not leftovers(env)
        assert run_cli("stop", env=env).returncode == 3
        assert run_cli("status", env=env).returncode == 3
    finally:
        for proc in leftovers(env):
            proc.kill()


def test_foreground_stops_cleanly_on_sigterm(
    fairserve_exe: Path, env: dict[str, str], tmp_path: Path
) -> None:
    profile = str(write_profile(tmp_path))
    proc = subprocess.Popen(
        [str(fairserve_exe), "launch", "--port", "0", "--engine", "sim", "--workers", "1",
         "--profile", profile, "--speed", "50"],
        env={**os.environ, **env, "NO_COLOR": "1"},
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "router listening" not in proc.stderr.readline():
            pass
        url = json.loads(Path(env["XDG_RUNTIME_DIR"], "fairserve", "run.json").read_text())
        assert http_json(url["router_url"] + "/v1/completions", COMPLETION)[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not leftovers(env)
    finally:
        if proc.poll() is None:
            proc.kill()
        for proc_left in leftovers(env):
            proc_left.kill()


def _fails(run_cli: RunCli, env: dict[str, str], code: int, text: str, *args: str) -> None:
    result = run_cli("launch", *args, env=env)
    assert result.returncode == code, result.stderr
    assert text in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not leftovers(env)
    assert not Path(env["XDG_RUNTIME_DIR"], "fairserve", "run.json").exists()


def test_port_in_use(run_cli: RunCli, env: dict[str, str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        _fails(run_cli, env, 1, "address already in use", "--port", port, "--detach")


def test_bad_profile_path(run_cli: RunCli, env: dict[str, str], tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.toml")
    _fails(run_cli, env, 2, missing, "--engine", "sim", "--profile", missing, "--port", "0")


def test_unreachable_worker_url(run_cli: RunCli, env: dict[str, str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    _fails(run_cli, env, 3, f"{url} did not answer /health",
           "--worker-url", url, "--ready-timeout", "1", "--port", "0", "--detach")  # fmt: skip


def test_sglang_without_model_is_usage(run_cli: RunCli, env: dict[str, str]) -> None:
    _fails(run_cli, env, 2, "--model is required", "--engine", "sglang", "--port", "0")


def test_sglang_missing_is_an_error(run_cli: RunCli, env: dict[str, str]) -> None:
    # exit 1 whether SGLang is absent ("not installed") or present ("not available yet")
    _fails(run_cli, env, 1, "SGLang", "--engine", "sglang", "--model", "m", "--port", "0")
