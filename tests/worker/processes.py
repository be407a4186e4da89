"""Run ``fairserve worker`` (and other servers) as real subprocesses, with bounded waits."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

READY = re.compile(r"fairserve worker listening on (http://\S+)")


def worker_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "fairserve", "worker", *args]


def spawn(argv: list[str], log: IO[str] | None = None) -> subprocess.Popen[str]:
    """Start ``argv``; its output goes to pipes, or to ``log`` for chatty programs (a full
    pipe would block them)."""
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("FAIRSERVE_DEBUG", None)
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if log is None else log,
        stderr=subprocess.PIPE if log is None else subprocess.STDOUT,
        text=True,
        env=env,
    )


def read_ready_url(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> str:
    """The URL from the worker's ready line on stderr (fails if it exits or stays silent)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.1)
        if ready:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            match = READY.search(line)
            if match:
                return match.group(1)
        elif proc.poll() is not None:
            break
    raise AssertionError(f"worker not ready (exit {proc.poll()}): {''.join(seen)}")


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
    """Send ``sig`` and wait; kill (and fail) if the process does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
        raise AssertionError(f"process {proc.args!r} ignored signal {sig}") from None


@contextmanager
def worker_process(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = spawn(worker_command("--port", "0", *args))
    try:
        yield proc, read_ready_url(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def http_json(url: str, body: Any = None, timeout_s: float = 10.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_http_ok(url: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer 200 within {timeout_s} s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
