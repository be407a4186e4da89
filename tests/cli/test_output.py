"""The output sink: data on stdout only, diagnostics on stderr only."""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.table import Table

from fairserve.commands.output import Output


def _sink(json_mode: bool) -> tuple[Output, io.StringIO, io.StringIO]:
    stdout, stderr = io.StringIO(), io.StringIO()
    return Output(json_mode=json_mode, stdout=stdout, stderr=stderr), stdout, stderr


def _table() -> Table:
    table = Table("name")
    table.add_row("dlpm")
    return table


def test_json_mode_prints_only_the_json_document() -> None:
    out, stdout, stderr = _sink(json_mode=True)
    out.data({"a": [1, 2.5, "x"]})
    out.render(_table())
    out.note("a note")
    assert json.loads(stdout.getvalue()) == {"a": [1, 2.5, "x"]}
    assert "a note" in stderr.getvalue()
    assert "a note" not in stdout.getvalue()


def test_human_mode_prints_tables_not_json() -> None:
    out, stdout, stderr = _sink(json_mode=False)
    out.data({"a": 1})
    out.render(_table())
    out.warn("careful")
    assert "dlpm" in stdout.getvalue()
    assert '"a"' not in stdout.getvalue()
    assert stderr.getvalue().strip() == "warning: careful"


def test_nan_is_refused_rather_than_printed_as_invalid_json() -> None:
    out, stdout, _ = _sink(json_mode=True)
    with pytest.raises(ValueError):
        out.data({"x": math.nan})
    assert stdout.getvalue() == ""


def test_default_streams_follow_sys_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    out = Output(json_mode=True)
    out.data([1])
    out.note("diag")
    captured = capsys.readouterr()
    assert json.loads(captured.out) == [1]
    assert "diag" in captured.err
