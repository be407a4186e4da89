"""``launch --detach``: start the supervisor in the background and wait until it serves.

The background supervisor is this same program (``python -m fairserve launch --supervise
RUNDIR``) in a new session, so it survives the terminal closing and runs exactly the code a
foreground launch runs. The options travel in ``RUNDIR/launch.json`` rather than on the
command line, so nothing is parsed twice. The parent validates everything first (the same
:func:`build_plan`), so most mistakes are reported directly; what can only fail in the
child (a worker that crashes at start) comes back as the child's exit status and the error
line from its log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from fairserve.api import paths
from fairserve.cluster import runfile
from fairserve.cluster.options import LaunchOptions
from fairserve.cluster.paths import new_run_dir
from fairserve.cluster.run import OPTIONS_FILE
from fairserve.cluster.runfile import RunInfo
from fairserve.core.errors import FairserveError

EXTRA_WAIT_S = 30.0
"""Beyond the workers' ready timeout: interpreter start-up and the router's own start."""


class SupervisorFailed(FairserveError):
    """The background supervisor exited before it was ready; carries its exit status."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def start_detached(options: LaunchOptions) -> RunInfo:
    """Spawn the background supervisor and return its run file once the router answers."""
    runfile.refuse_if_running()
    run_dir = new_run_dir()
    options.save(run_dir / OPTIONS_FILE)
    log_path = run_dir / "supervisor.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fairserve", "launch", "--supervise", str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NO_COLOR": "1"},
            start_new_session=True,
        )
    try:
        return _wait_ready(proc, log_path, options.ready_timeout_s + EXTRA_WAIT_S)
    except BaseException:
        _terminate(proc)
        raise


def _wait_ready(proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float) -> RunInfo:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            raise SupervisorFailed(_failure_message(log_path, code), code)
        info = runfile.read()
        if info is not None and info.supervisor_pid == proc.pid and _answers(info.router_url):
            return info
        time.sleep(0.1)
    raise FairserveError(f"the supervisor was not ready within {timeout_s:g} s; see {log_path}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + paths.HEALTH, timeout=1.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _failure_message(log_path: Path, code: int) -> str:
    """The child's own error line (it went through the same error reporting) + its log."""
    text = log_path.read_text(encoding="utf-8", errors="replace")
    errors = [line for line in text.splitlines() if line.startswith("fairserve: error:")]
    cause = errors[-1].removeprefix("fairserve: error: ") if errors else f"exit status {code}"
    return f"{cause} (supervisor log: {log_path})"


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """Stop a supervisor that failed to come up, and its whole session."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
