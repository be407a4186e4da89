"""``fairserve worker`` as a user runs it: a real process, signals and exit codes."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.worker.helpers import write_profile
from tests.worker.processes import (
    http_json,
    spawn,
    stop,
    worker_command,
    worker_process,
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_worker_serves_and_exits_cleanly_on_a_signal(tmp_path: Path, sig: int) -> None:
    profile = write_profile(tmp_path)
    with worker_process("--speed", "50", "--profile", str(profile), "--policy", "vtc") as (
        proc,
        url,
    ):
        assert url.startswith("http://127.0.0.1:")
        assert http_json(url + "/health")[0] == 200
        status, out = http_json(
            url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3}}
        )
        assert status == 200
        assert out["meta_info"]["completion_tokens"] == 3
        _, info = http_json(url + "/get_server_info")
        assert info["fairserve"]["policy"] == "vtc"
        assert info["fairserve"]["profile"] == "tiny"
        assert stop(proc, sig) == 0
        assert proc.stderr is not None
        assert "shutting down" in proc.stderr.read()


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            worker_command("--port", str(port)),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "nope"], "unknown local policy 'nope'"),
        (["--policy", "vtc", "--quantum", "5"], "policy vtc has no quantum"),
        (["--param", "w_q"], "--param 'w_q': expected key=value"),
        (["--speed", "-1"], "--speed: expected a positive number"),
        (["--profile", "no-such-profile"], "unknown profile 'no-such-profile'"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    proc = spawn(worker_command("--port", "0", *args))
    try:
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, stderr
    assert message in stderr
