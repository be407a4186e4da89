"""The README's command table names only options the commands have, so a reader who
copies one from it is not told ``No such option``; and every option of a command the
operator passes often is in its row (the rows list the options, not all of them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer

from fairserve.commands.app import app

ROOT = Path(__file__).resolve().parents[2]


def _rows() -> list[tuple[list[str], set[str]]]:
    """(command words, options named) per row of the README's Commands table."""
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Commands", 1)[1].split("\n\n", 2)[1]
    rows = []
    for line in table.splitlines():
        cells = line.replace("\\|", "/").split("|")  # an escaped pipe is in a cell
        cell = cells[1].strip() if line.startswith("| `fairserve") else ""
        match = re.match(r"`fairserve ((?:[a-z]+ ?)+)", cell)
        if match is None:
            continue
        words = [w for w in match.group(1).split() if not w.startswith("-")]
        rows.append((words, set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", cell))))
    return rows


def _command(words: list[str]) -> Any:
    """The (vendored) click command for ``words``."""
    command: Any = typer.main.get_command(app)
    for word in words:
        command = command.commands[word]
    return command


def _options(command: Any) -> set[str]:
    names = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    return names | {"--help", "--version"}


ROWS = _rows()


def test_the_table_has_a_row_per_command() -> None:
    commands = {" ".join(words) for words, _ in ROWS}
    assert {"launch", "status", "stop", "simulate", "worker", "router", "bench", "top"} <= commands


@pytest.mark.parametrize(("words", "named"), ROWS, ids=[" ".join(w) or "-" for w, _ in ROWS])
def test_every_option_in_the_row_exists(words: list[str], named: set[str]) -> None:
    command = _command(words) if words else typer.main.get_command(app)
    assert named - _options(command) == set()
