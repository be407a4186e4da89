"""The output sink every command writes through.

Scripts pipe fairserve's stdout into ``jq`` while people read the terminal, so the two
streams have fixed jobs (DESIGN §4): **stdout carries only data** (one JSON document with
``--json``, else rich tables), **stderr carries diagnostics** (notes, warnings, progress,
errors). Routing every write through this class keeps that rule in one place.

``rich`` is imported on first use, not at import time, so commands that only print JSON (and
``fairserve --version``) stay fast.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console, RenderableType


class Output:
    """Writes data to ``stdout`` and diagnostics to ``stderr``.

    ``json_mode`` is the command's ``--json`` flag: commands call :meth:`data` with the
    JSON-able result and :meth:`render` with the human view, and only the matching one
    prints, so the two views cannot diverge in which command paths print at all.
    """

    def __init__(
        self,
        *,
        json_mode: bool = False,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        self.json_mode = json_mode
        self._stdout = stdout
        self._stderr = stderr
        self._out_console: Console | None = None
        self._err_console: Console | None = None

    @property
    def stdout(self) -> TextIO:
        # Resolved late so that pytest's capsys (which swaps sys.stdout) sees the writes.
        return self._stdout if self._stdout is not None else sys.stdout

    @property
    def stderr(self) -> TextIO:
        return self._stderr if self._stderr is not None else sys.stderr

    # ------------------------------------------------------------------ data (stdout)
    def data(self, payload: Any) -> None:
        """Print ``payload`` as one JSON document (only in JSON mode).

        ``allow_nan=False``: NaN/Infinity are not JSON, and a consumer's parser would choke
        on them later; failing here points at the producer instead.
        """
        if not self.json_mode:
            return
        self.stdout.write(json.dumps(payload, indent=2, allow_nan=False) + "\n")
        self.stdout.flush()

    def render(self, *renderables: RenderableType) -> None:
        """Print rich renderables (tables, text) to stdout (only in human mode)."""
        if self.json_mode:
            return
        console = self._console_out()
        for renderable in renderables:
            console.print(renderable)

    # ------------------------------------------------------------------ diagnostics (stderr)
    def note(self, message: str) -> None:
        """A diagnostic a user may want to see (e.g. "no GPU found, using the sim engine")."""
        self._console_err().print(message, style="dim", highlight=False, markup=False)

    def warn(self, message: str) -> None:
        """Something is off but the command goes on."""
        self._console_err().print(
            f"warning: {message}", style="yellow", highlight=False, markup=False
        )

    # ------------------------------------------------------------------ consoles
    def _console_out(self) -> Console:
        if self._out_console is None:
            self._out_console = console_for(self.stdout)
        return self._out_console

    def _console_err(self) -> Console:
        if self._err_console is None:
            self._err_console = console_for(self.stderr)
        return self._err_console


# Wide enough for any table fairserve prints; rich sizes tables to their content, so the
# width only stops it from squeezing columns into "180.9…" (it pads nothing).
PIPE_WIDTH_COLS = 10_000


def console_for(stream: TextIO) -> Console:
    """A rich console for ``stream`` that never cuts data when no person is reading.

    On a terminal rich fits tables to the window, as people expect. In a pipe or a log rich
    would assume 80 columns (or ``$COLUMNS``) and crop cells with an ellipsis, so numbers
    reach ``grep`` and log files cut; there the width is :data:`PIPE_WIDTH_COLS` and long
    lines are not wrapped.
    """
    from rich.console import Console

    if _is_terminal(stream):
        return Console(file=stream)
    return Console(file=stream, width=PIPE_WIDTH_COLS, soft_wrap=True)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
