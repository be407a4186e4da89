"""Log lines for long-running processes (``worker``, ``router``): timestamped, one per event.

A worker's or router's stderr ends up in a log file (``launch`` writes one per worker) that
an operator reads after something went wrong; without a time on each line an ejection or a
failure cannot be matched with what clients saw. Every line starts with the local date and
time to the second, like ``2026-11-25 13:42:45 fairserve router: WARNING: worker ... ejected``.
"""

from __future__ import annotations

import logging
import sys
import time

TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def configure(prefix: str, level: int = logging.WARNING) -> None:
    """Route the process's log records to stderr as ``<time> <prefix>: LEVEL: message``.

    Replaces a handler set up earlier in the process (``logging.basicConfig`` is otherwise
    a no-op once the root logger has one), so the format holds however the command began.
    """
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s {prefix}: %(levelname)s: %(message)s",
        datefmt=TIME_FORMAT,
        stream=sys.stderr,
        force=True,
    )


def line(text: str) -> None:
    """One timestamped line on stderr (status lines that are not log records)."""
    sys.stderr.write(f"{time.strftime(TIME_FORMAT)} {text}\n")
    sys.stderr.flush()
