"""``--url`` of every client command: a value that is no http(s) URL with a host and a valid
port is a usage error (exit 2, a message naming ``--url``), never an internal error, and
checked before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairserve.commands.app import run
from fairserve.commands.errors import ExitCode

BAD_URLS = ["notaurl", "ftp://127.0.0.1:8000", "http://", "http://127.0.0.1:99999", "http://[::1"]

COMMANDS = [
    ["status"],
    ["tune", "quantum"],
    ["tune", "weight"],
    ["top"],
    ["profile", "--quick"],
    ["bench", "--workload", "vtc-constant", "--duration", "1"],
]


@pytest.fixture(autouse=True)
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No run file of the user's, no token from the environment."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("FAIRSERVE_ADMIN_TOKEN", raising=False)


@pytest.mark.parametrize("url", BAD_URLS)
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_bad_url_is_a_usage_error(
    command: list[str], url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run([*command, "--url", url])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE, err
    assert "--url" in err
    assert "internal error" not in err


def test_a_url_with_a_path_prefix_is_accepted() -> None:
    """A router behind a reverse proxy's path: the check lets it through (the router then
    answers or not: exit 3 here, as nothing listens)."""
    assert run(["status", "--url", "http://127.0.0.1:9/fairserve-proxy"]) == ExitCode.UNAVAILABLE
