"""``fairserve launch``, ``status`` and ``stop`` as a user runs them: real processes on
127.0.0.1, private XDG directories, every wait bounded.

The long test is the user's story end to end (detach, serve, status, a worker killed and
restarted, stop, nothing left); the short ones are the mistakes users make, each of which
must give a clear message, the right exit code, and leave nothing running.
"""

from __future__ import annotations

import json
import os
import shlex
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
    """Private state and runtime directories (as XDG asks, the runtime one 0700)."""
    (tmp_path / "run").mkdir(mode=0o700)
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


def stop_and_reap(run_cli: RunCli, env: dict[str, str]) -> None:
    """``fairserve stop``, then up to 10 s for this test's processes to end; any still there
    are killed, so that a failed test leaves no router or worker behind."""
    run_cli("stop", env=env)
    deadline = time.monotonic() + 10
    while leftovers(env) and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in leftovers(env):
        proc.kill()


def _status(run_cli: RunCli, env: dict[str, str]) -> dict[str, Any]:
    result = run_cli("status", "--json", env=env)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _wait_restarted(run_cli: RunCli, env: dict[str, str], old_pid: int) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        worker: dict[str, Any] = _status(run_cli, env)["workers"][0]
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
        assert "GPU" not in again.stderr, "the refusal comes before any plan notice"
        foreground = run_cli("launch", "--port", "0", env=env)
        assert foreground.returncode == 1 and "already running" in foreground.stderr
        assert "GPU" not in foreground.stderr

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


def test_unwritable_record_path(run_cli: RunCli, env: dict[str, str], tmp_path: Path) -> None:
    trace = str(tmp_path / "no-such-dir" / "trace.jsonl")
    _fails(run_cli, env, 2, f"--record {trace}: directory", "--record", trace, "--port", "0",
           "--detach")  # fmt: skip
    result = run_cli("router", "--worker-url", "http://127.0.0.1:9", "--port", "0",
                     "--record", trace, env=env)  # fmt: skip
    assert result.returncode == 2 and "--record" in result.stderr, result.stderr


def test_unreachable_worker_url(run_cli: RunCli, env: dict[str, str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    _fails(run_cli, env, 3, f"{url} did not answer /health",
           "--worker-url", url, "--ready-timeout", "1", "--port", "0", "--detach")  # fmt: skip


def test_sglang_without_model_is_usage(run_cli: RunCli, env: dict[str, str]) -> None:
    _fails(run_cli, env, 2, "--model is required", "--engine", "sglang", "--port", "0")


def test_sglang_missing_is_an_error(run_cli: RunCli, env: dict[str, str]) -> None:
    # exit 1: SGLang absent here, or (where it is installed) no GPU to run it on
    result = run_cli("launch", "--engine", "sglang", "--model", "m", "--port", "0", env=env)
    assert result.returncode == 1, result.stderr
    assert "SGLang is not installed" in result.stderr or "no NVIDIA GPU" in result.stderr
    assert "Traceback" not in result.stderr and not leftovers(env)


SGLANG_DRY_RUN = ("launch", "--engine", "sglang", "--model", "org/model", "--gpus", "0,1",
                  "--quantum", "128", "--dry-run")  # fmt: skip


def test_sglang_dry_run_prints_commands_and_environment(
    run_cli: RunCli, env: dict[str, str]
) -> None:
    result = run_cli(*SGLANG_DRY_RUN, "--", "--mem-fraction-static", "0.8", env=env)
    assert result.returncode == 0, result.stderr
    commands = [shlex.split(line) for line in result.stdout.splitlines() if line.startswith("env ")]
    assert len(commands) == 2
    for gpu, words in enumerate(commands):
        split = words.index("-m") - 1  # the interpreter; before it: env -u NAME NAME=VALUE...
        variables = dict(w.split("=", 1) for w in words[1:split] if "=" in w)
        argv = words[split:]
        assert variables["CUDA_VISIBLE_DEVICES"] == str(gpu)
        assert variables["SGLANG_PLUGINS"] == "fairserve"
        assert variables["FAIRSERVE_POLICY"] == "dlpm" and variables["FAIRSERVE_QUANTUM"] == "128"
        assert variables["FAIRSERVE_EXTENSION_PORT"].isdigit()
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        assert argv[argv.index("--model-path") + 1] == "org/model"
        assert "--enable-metrics" in argv and argv[-2:] == ["--mem-fraction-static", "0.8"]
    assert "# router" in result.stdout and "policy dlpm, dispatch doubleq" in result.stdout
    assert not leftovers(env)
    assert not Path(env["XDG_RUNTIME_DIR"], "fairserve", "run.json").exists()


def test_sglang_dry_run_json(run_cli: RunCli, env: dict[str, str]) -> None:
    result = run_cli(*SGLANG_DRY_RUN, "--tp", "2", "--json", env=env)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["engine"] == "sglang" and plan["ready_timeout_s"] == 900
    (worker,) = plan["workers"]
    assert worker["gpus"] == [0, 1] and worker["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert worker["argv"][worker["argv"].index("--tp-size") + 1] == "2"
    assert plan["router"]["worker_urls"] == [worker["url"]]
    assert plan["router"]["extension_urls"] == {worker["url"]: worker["extension_url"]}
    assert worker["env"]["FAIRSERVE_ADMIN_TOKEN"].startswith("<")  # never a real secret


def test_sim_dry_run_shows_the_simulated_workers(
    run_cli: RunCli, env: dict[str, str], tmp_path: Path
) -> None:
    profile = str(write_profile(tmp_path))
    result = run_cli("launch", "--engine", "sim", "--profile", profile, "--dry-run", "--json",
                     env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["engine"] == "sim" and len(plan["workers"]) == 2
    assert all(w["argv"][1:4] == ["-m", "fairserve", "worker"] for w in plan["workers"])
    assert plan["router"]["extension_urls"] == {}


def test_router_settings_reach_the_launched_router(
    run_cli: RunCli, env: dict[str, str], tmp_path: Path
) -> None:
    """``launch`` takes ``fairserve router``'s settings and puts them in the router's config
    (the supervisor starts the router from that config); bad ones fail before anything."""
    profile = str(write_profile(tmp_path))
    result = run_cli("launch", "--engine", "sim", "--profile", profile, "--dry-run", "--json",
                     "--queue-cap", "7", "--max-body-bytes", "4096", "--router-queue", "on",
                     "--max-outstanding-per-worker", "3", "--metrics-max-clients", "0",
                     "--drain-timeout", "2.5", env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    router = json.loads(result.stdout)["router"]
    assert {k: router[k] for k in ("queue_cap", "max_body_bytes", "router_queue",
                                   "max_outstanding_per_worker", "metrics_max_clients",
                                   "drain_timeout_s")} == {
        "queue_cap": 7, "max_body_bytes": 4096, "router_queue": "on",
        "max_outstanding_per_worker": 3, "metrics_max_clients": 0, "drain_timeout_s": 2.5,
    }  # fmt: skip
    _fails(run_cli, env, 2, "expected one of: auto, on, off",
           "--engine", "sim", "--dry-run", "--router-queue", "sometimes")  # fmt: skip
    _fails(run_cli, env, 2, "--queue-cap", "--engine", "sim", "--dry-run", "--queue-cap", "0")


def test_upstream_timeouts_reach_the_launched_router(
    run_cli: RunCli, env: dict[str, str], tmp_path: Path
) -> None:
    profile = str(write_profile(tmp_path))
    result = run_cli("launch", "--engine", "sim", "--profile", profile, "--dry-run", "--json",
                     "--request-timeout", "90", "--first-byte-timeout", "45",
                     "--stall-timeout", "7.5", "--outlier-failures", "5", env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    router = json.loads(result.stdout)["router"]
    assert (router["request_timeout_s"], router["first_byte_timeout_s"]) == (90, 45)
    assert (router["stall_timeout_s"], router["outlier_failures"]) == (7.5, 5)
    assert router["settings_file"].endswith("settings.json")
    _fails(run_cli, env, 2, "--stall-timeout", "--engine", "sim", "--dry-run",
           "--stall-timeout", "0")  # fmt: skip


def test_sglang_only_options_are_refused_for_sim(run_cli: RunCli, env: dict[str, str]) -> None:
    _fails(run_cli, env, 2, "--tp: applies to --engine sglang",
           "--engine", "sim", "--tp", "2", "--dry-run")  # fmt: skip
    _fails(run_cli, env, 2, "-- SGLANG_ARGS: applies to --engine sglang",
           "--engine", "sim", "--dry-run", "--", "--foo")  # fmt: skip


STAND_IN_SGLANG = """
# A stand-in for ``python -m sglang.launch_server`` (no GPU here): it records what it was
# started with, serves the fairserve extension from its environment the way the plugin
# does inside SGLang's scheduler, and a simulated worker on --port in place of the model.
import json, os, sys
from pathlib import Path
from types import SimpleNamespace

from fairserve.commands.app import run
from fairserve.sglang.config import config_from_env
from fairserve.sglang.extension import ExtensionServer
from fairserve.sglang.hooks import make_host

args = sys.argv[1:]
port = args[args.index("--port") + 1]
record = {k: v for k, v in os.environ.items() if k.startswith(("FAIRSERVE_", "SGLANG_", "CUDA_"))}
Path(os.environ["STAND_IN_RECORD"], port + ".json").write_text(json.dumps([args, record]))
config = config_from_env(os.environ)
host = make_host(config, SimpleNamespace(max_total_num_tokens=4096), SimpleNamespace())
ExtensionServer(host, config.extension_host, config.extension_port, config.admin_token).start()
sys.exit(run(["worker", "--host", args[args.index("--host") + 1], "--port", port,
              "--speed", "50", "--profile", os.environ["STAND_IN_PROFILE"]]))
"""


def test_sglang_launch_with_a_stand_in_engine(
    run_cli: RunCli, env: dict[str, str], tmp_path: Path
) -> None:
    """The whole launch path of --engine sglang without a GPU: per-GPU environment, the
    plugin's settings, health wait, router, extension on the side port, stop."""
    package = tmp_path / "stand_in" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(STAND_IN_SGLANG)
    records = tmp_path / "records"
    records.mkdir()
    env = {**env, "PYTHONPATH": str(tmp_path / "stand_in"), "STAND_IN_RECORD": str(records),
           "STAND_IN_PROFILE": str(write_profile(tmp_path))}  # fmt: skip
    launched = run_cli("launch", "--detach", "--engine", "sglang", "--model", "org/model",
                       "--gpus", "0,1", "--quantum", "64", "--port", "0", "--ready-timeout",
                       "40", env=env)  # fmt: skip
    try:
        assert launched.returncode == 0, launched.stderr
        url = launched.stdout.strip()
        status, answer = http_json(url + "/v1/completions", COMPLETION)
        assert status == 200 and answer["usage"]["completion_tokens"] == 4
        run_file = json.loads(Path(env["XDG_RUNTIME_DIR"], "fairserve", "run.json").read_text())
        assert run_file["engine"] == "sglang"
        started = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
        assert sorted(r["CUDA_VISIBLE_DEVICES"] for _, r in started) == ["0", "1"]
        for argv, variables in started:
            assert (
                "--enable-metrics" in argv and argv[argv.index("--model-path") + 1] == "org/model"
            )
            assert variables["SGLANG_PLUGINS"] == "fairserve"
            assert (
                variables["FAIRSERVE_POLICY"] == "dlpm" and variables["FAIRSERVE_QUANTUM"] == "64"
            )
            assert variables["FAIRSERVE_ADMIN_TOKEN"] == run_file["admin_token"]
            extension = f"http://127.0.0.1:{variables['FAIRSERVE_EXTENSION_PORT']}"
            status, state = http_json(extension + "/fairserve/worker/state")
            assert status == 200 and state["policy"]["quantum"] == 64
        logs = [Path(w["log"]) for w in run_file["workers"]]
        assert all(log.exists() for log in logs)
        assert run_cli("stop", env=env).returncode == 0
        assert not leftovers(env)
    finally:
        for proc in leftovers(env):
            proc.kill()
