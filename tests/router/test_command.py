"""``fairserve router`` as a real process: ready line, /health, SIGTERM, bad arguments."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.worker.helpers import write_profile
from tests.worker.processes import http_json, spawn, stop, wait_http_ok, worker_process

READY = re.compile(r"fairserve router listening on (http://\S+)")


def _router(*args: str) -> list[str]:
    return [sys.executable, "-m", "fairserve", "router", *args]


def _ready_url(proc: subprocess.Popen[str]) -> tuple[str, list[str]]:
    assert proc.stderr is not None
    lines = []
    for _ in range(20):
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        match = READY.search(line)
        if match:
            return match.group(1), lines
    raise AssertionError(f"router not ready: {''.join(lines)}")


@contextmanager
def router_process(*args: str) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """``fairserve router ARGS`` as a process: the process, its URL and the lines it wrote
    until ready. Killed at the end if the test left it running."""
    proc = spawn(_router(*args))
    try:
        url, lines = _ready_url(proc)
        yield proc, url, lines
    finally:
        stop(proc, signal.SIGKILL)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_router_serves_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    profile = str(write_profile(tmp_path))
    with (
        worker_process("--speed", "100", "--profile", profile) as (_, worker_url),
        router_process("--worker-url", worker_url, "--port", "0") as (proc, url, _),
    ):
        wait_http_ok(url + "/health")
        status, answer = http_json(url + "/v1/completions", {"prompt": "hello", "max_tokens": 3})
        assert status == 200 and answer["usage"]["completion_tokens"] == 3
        assert stop(proc, signal.SIGTERM) == 0


def test_unreachable_worker_is_a_warning_not_a_crash() -> None:
    with router_process("--worker-url", "http://127.0.0.1:9", "--port", "0") as (proc, url, lines):
        assert any("unreachable" in line and "127.0.0.1:9" in line for line in lines)
        status, answer = http_json(url + "/health")
        assert status == 503 and answer["healthy_workers"] == 0
        assert stop(proc, signal.SIGTERM) == 0


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_router(*args), capture_output=True, text=True, timeout=30, check=False)


def test_bad_arguments_exit_2_with_a_clear_message(tmp_path: Path) -> None:
    missing = _run()
    assert missing.returncode == 2 and "--worker-url" in missing.stderr
    bad_url = _run("--worker-url", "localhost:8000")
    assert bad_url.returncode == 2 and "expected http://HOST:PORT" in bad_url.stderr
    bad_dispatch = _run("--worker-url", "http://127.0.0.1:9", "--dispatch", "nope")
    assert bad_dispatch.returncode == 2 and "round-robin" in bad_dispatch.stderr
    clients = tmp_path / "clients.toml"
    clients.write_text('[[clients]]\nname = "a"\napi_key = "k"\nweight = -1\n')
    bad_file = _run("--worker-url", "http://127.0.0.1:9", "--clients", str(clients))
    assert bad_file.returncode == 2
    assert "clients.toml: clients[0].weight: expected a positive number" in bad_file.stderr
    no_quantum = _run("--worker-url", "http://127.0.0.1:9", "--policy", "fcfs", "--quantum", "5")
    assert no_quantum.returncode == 2 and "policy fcfs has no quantum" in no_quantum.stderr
