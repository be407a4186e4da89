"""Local worker processes: start, watch, restart with backoff, stop.

Workers run in their own session (``start_new_session``): a Ctrl-C in the terminal reaches
the supervisor only, which then stops the router first and the workers after it, instead of
every process dying at once while requests are in flight. On Linux each worker also asks the
kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), so even a supervisor killed
with SIGKILL leaves no orphaned worker behind.

Restarts back off exponentially (0.5 s, 1 s, 2 s, ... up to 30 s) so a worker that crashes
on start (bad GPU, port taken) does not spin; a worker that stayed up for
``STABLE_AFTER_S`` starts again from the shortest delay.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fairserve.cluster.runfile import WorkerEntry, process_create_time
from fairserve.cluster.worker_spec import WorkerSpec

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 30.0
PR_SET_PDEATHSIG = 1


def backoff_s(failures: int) -> float:
    """Delay before the restart that follows ``failures`` consecutive crashes (>= 1)."""
    return float(min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** max(0, failures - 1)))


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class ManagedWorker:
    """One worker subprocess and its restart bookkeeping (all times monotonic seconds)."""

    def __init__(self, spec: WorkerSpec, log_path: Path, env: dict[str, str]) -> None:
        self.spec = spec
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.failures = 0
        self.started_s = 0.0
        self.restart_at_s: float | None = None

    def start(self) -> None:
        """Spawn the worker; its output is appended to the log (restarts included)."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**self.env, **dict(self.spec.env)},
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        self.started_s = time.monotonic()
        self.restart_at_s = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def exit_code(self) -> int | None:
        """The exit status if the process ended (reaps it), else None."""
        return None if self.proc is None else self.proc.poll()

    def check(self, now_s: float, log: Callable[[str], None]) -> bool:
        """Notice a crash and schedule or perform the restart; True when the entry changed."""
        if self.restart_at_s is not None:
            if now_s < self.restart_at_s:
                return False
            self.restarts += 1
            self.start()
            log(f"{self.spec.name}: restarted (pid {self.pid}, restart {self.restarts})")
            return True
        code = self.exit_code()
        if code is None:
            return False
        stable = now_s - self.started_s >= STABLE_AFTER_S
        self.failures = 1 if stable else self.failures + 1
        delay_s = backoff_s(self.failures)
        self.restart_at_s = now_s + delay_s
        log(
            f"{self.spec.name}: exited with status {code}; restarting in {delay_s:g} s "
            f"(log: {self.log_path})"
        )
        return False

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_or_kill(self, deadline_s: float) -> None:
        """Wait for the exit until ``deadline_s`` (monotonic), then SIGKILL."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=max(0.0, deadline_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def entry(self) -> WorkerEntry:
        pid = self.pid if self.exit_code() is None else None
        return WorkerEntry(
            name=self.spec.name,
            url=self.spec.url,
            pid=pid,
            create_time=None if pid is None else process_create_time(pid),
            log=str(self.log_path),
            restarts=self.restarts,
        )


def worker_env(admin_token: str) -> dict[str, str]:
    """The workers' environment: the admin token by variable, never on the command line
    (``ps`` shows arguments to every user). Each worker adds its spec's variables (SGLang:
    its GPUs and the plugin's settings)."""
    env = {**os.environ, **_added_env(admin_token)}
    env.pop("FAIRSERVE_DEBUG", None)
    return env


def _added_env(admin_token: str) -> dict[str, str]:
    return {"FAIRSERVE_ADMIN_TOKEN": admin_token, "NO_COLOR": "1"}


HIDDEN_TOKEN = "<admin token, generated at launch>"


def describe(spec: WorkerSpec) -> dict[str, object]:
    """What ``launch`` would run for ``spec`` (``--dry-run``): the command and every variable
    fairserve sets on top of its own environment, the admin token shown as a placeholder."""
    return {
        "name": spec.name,
        "url": spec.url,
        "extension_url": spec.extension_url,
        "gpus": list(spec.gpus),
        "argv": list(spec.argv),
        "env": {**dict(spec.env), **_added_env(HIDDEN_TOKEN)},
        "unset_env": ["FAIRSERVE_DEBUG"],
    }
