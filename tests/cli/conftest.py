"""Helpers that run the real ``fairserve`` executable and real shells, as users do."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAIRSERVE_EXE = Path(sys.executable).parent / ("fairserve.exe" if os.name == "nt" else "fairserve")
"""The console script installed next to this interpreter (``pip install -e .``)."""

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def run_fairserve(
    *args: str,
    env: Mapping[str, str] | None = None,
    unset: Sequence[str] = (),
    timeout_s: float = 60,
    module: bool = False,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``fairserve ARGS...`` as a user's shell does: its own process, no stdin, no
    terminal, plain text (``NO_COLOR``) at 120 columns, ``FAIRSERVE_DEBUG`` off.

    ``env`` goes on top of this process's environment and ``unset`` names leave it;
    ``module`` starts ``python -m fairserve`` instead of the console script. The one way the
    tests start the CLI, so that every such test sees the same environment.
    """
    full_env = {k: v for k, v in os.environ.items() if k != "FAIRSERVE_DEBUG" and k not in unset}
    full_env.update({"NO_COLOR": "1", "COLUMNS": "120", **(env or {})})
    program = [sys.executable, "-m", "fairserve"] if module else [str(FAIRSERVE_EXE)]
    return subprocess.run(
        [*program, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=full_env,
        cwd=cwd,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture(scope="session")
def fairserve_exe() -> Path:
    """The console script, checked to be installed."""
    exe = FAIRSERVE_EXE
    assert exe.exists(), f"{exe} missing: install the project with pip install -e '.[test]'"
    return exe


@pytest.fixture
def run_cli(fairserve_exe: Path) -> RunCli:
    """:func:`run_fairserve`, once the console script is known to be installed."""
    return run_fairserve


def complete_words(shell: str, script: str, *words: str) -> list[str]:
    """What ``shell`` offers after ``script`` is loaded and ``words`` are typed.

    The first word is the program; the last is the one being completed ("" for a fresh
    word). Skips the test when the shell is not installed.
    """
    exe = shutil.which(shell)
    if exe is None:
        pytest.skip(f"{shell} not installed")
    if shell == "bash":
        quoted = " ".join(f"'{w}'" for w in words)
        program = (
            f"{script}\nCOMP_WORDS=({quoted}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))\n"
            f"COMPREPLY=(); _{words[0]}; printf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
        )
        argv = [exe, "--norc", "--noprofile"]
    elif shell == "fish":
        program = f"{script}\ncomplete -C '{' '.join(words)}'\n"
        argv = [exe, "--no-config"]
    else:
        raise ValueError(f"no completion driver for {shell}")
    result = subprocess.run(
        argv, input=program, capture_output=True, text=True, timeout=60, check=True
    )
    return sorted(line.split("\t")[0] for line in result.stdout.splitlines() if line)
