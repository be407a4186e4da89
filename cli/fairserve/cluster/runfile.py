"""The run file: how ``status``, ``stop``, ``top`` and ``tune`` find what ``launch`` started.

One JSON document, written atomically (temporary file + rename, so a reader never sees half
of it) with mode 0600 because it holds the router's admin token. Process ids are stored with
their creation times: a pid alone may be reused by an unrelated process after a crash, and
``stop`` must never signal a stranger.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from fairserve.cluster.paths import ensure_private_dir, run_file_path
from fairserve.core.errors import FairserveError

FORMAT_VERSION = 1


@dataclass
class WorkerEntry:
    """One worker: ``pid``/``log`` are None for workers started elsewhere (``--worker-url``)."""

    name: str
    url: str
    pid: int | None = None
    create_time: float | None = None
    log: str | None = None
    restarts: int = 0
    managed: bool = True
    node: str | None = None
    """``--ray``: the Ray node it runs on (its pid is a process *there*)."""
    gpus: list[int] = field(default_factory=list)
    """The GPUs it was given (``CUDA_VISIBLE_DEVICES`` on its node)."""
    state: str | None = None
    """``--ray``: running, restarting, lost (its node died; it is not restarted), or unknown
    (its actor did not answer the last check)."""


@dataclass
class RunInfo:
    """Everything a later command needs to reach and stop a launch."""

    router_url: str
    admin_token: str
    supervisor_pid: int
    supervisor_create_time: float
    engine: str
    policy: str
    dispatch: str
    quantum: float | None
    worker_quantum: float | None
    run_dir: str
    workers: list[WorkerEntry] = field(default_factory=list)
    detached: bool = False
    ray_address: str | None = None
    """``--ray``: the Ray cluster the workers were placed on (its GCS address)."""
    version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunInfo:
        workers = [WorkerEntry(**w) for w in data.get("workers", [])]
        return cls(**{**data, "workers": workers})


def write(info: RunInfo, path: Path | None = None) -> Path:
    """Write ``info`` atomically with mode 0600 (created so, never chmod-ed after)."""
    target = path or run_file_path()
    ensure_private_dir(target.parent)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(info.to_json(), handle, indent=2)
        handle.write("\n")
    os.replace(tmp, target)
    return target


def read(path: Path | None = None) -> RunInfo | None:
    """The run file, or None when there is none; a corrupt one is an error naming it."""
    target = path or run_file_path()
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
        return RunInfo.from_json(data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        raise FairserveError(f"{target}: unreadable run file ({exc}); delete it") from None


def remove(path: Path | None = None, owner_pid: int | None = None) -> None:
    """Delete the run file; with ``owner_pid``, only if it is still that supervisor's (a
    newer launch may have replaced it)."""
    target = path or run_file_path()
    if owner_pid is not None:
        try:
            current = read(target)
        except FairserveError:
            current = None
        if current is not None and current.supervisor_pid != owner_pid:
            return
    target.unlink(missing_ok=True)


def process_create_time(pid: int) -> float | None:
    """The creation time psutil reports for ``pid``, or None if there is no such process."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def same_process(pid: int | None, create_time: float | None) -> psutil.Process | None:
    """The live process ``pid`` if it is the one recorded (same creation time), else None."""
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        matches = create_time is None or abs(proc.create_time() - create_time) < 0.01
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return proc if alive and matches else None


def live_run(path: Path | None = None) -> RunInfo | None:
    """The run file if its supervisor is still alive, else None."""
    info = read(path)
    if info is None:
        return None
    alive = same_process(info.supervisor_pid, info.supervisor_create_time)
    return info if alive is not None else None


def refuse_if_running(path: Path | None = None) -> None:
    """A second ``launch`` while one runs is an error, said before anything is planned:
    checked first by the command (so no plan notice precedes it) and again by the
    supervisor as it starts (a launch may have begun in between)."""
    running = live_run(path)
    if running is not None:
        raise FairserveError(
            f"fairserve is already running (supervisor pid {running.supervisor_pid}, "
            f"router {running.router_url}); stop it with: fairserve stop"
        )
