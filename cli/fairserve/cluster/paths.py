"""Where the run file and the logs live (XDG base directories).

The run file describes *live* processes, so it belongs in ``$XDG_RUNTIME_DIR`` when the
session has one: that directory is private to the user and emptied at logout or reboot, so
a crash can never leave a run file that outlives the machine's uptime. Logs must survive the
processes that wrote them (post-mortems), so they go to ``$XDG_STATE_HOME`` (default
``~/.local/state``). Without a runtime directory the run file goes to the state directory
too. Both are created with mode 0700.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

APP = "fairserve"
RUN_FILE_NAME = "run.json"
SETTINGS_FILE_NAME = "settings.json"


def state_dir() -> Path:
    """``$XDG_STATE_HOME/fairserve`` (default ``~/.local/state/fairserve``)."""
    base = os.environ.get("XDG_STATE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / APP


def run_file_path() -> Path:
    """The run file: in ``$XDG_RUNTIME_DIR/fairserve`` if set (and absolute), else the
    state directory (XDG says relative paths must be ignored)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR") or ""
    root = Path(runtime) / APP if os.path.isabs(runtime) else state_dir()
    return root / RUN_FILE_NAME


def settings_file_path() -> Path:
    """Weights and quanta changed live (``router.persist``), beside the run file: a new
    ``launch`` restores them."""
    return run_file_path().parent / SETTINGS_FILE_NAME


def new_run_dir() -> Path:
    """A fresh directory for one launch's logs: ``<state>/runs/<time>-<pid>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = state_dir() / "runs" / f"{stamp}-{os.getpid()}"
    ensure_private_dir(path)
    return path


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) readable by the user only: logs and the run file hold
    the admin token's neighbours (URLs, pids) and must not be world-readable."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path
