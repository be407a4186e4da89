"""The committed man pages and completions are what the generator produces now.

When this fails: ``python scripts/gen_docs.py`` and commit man/ and completions/.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import REPO, complete_words

GEN = REPO / "scripts" / "gen_docs.py"
DIRS = ("man", "completions")


def _gen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GEN), *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )


def _tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
        for d in DIRS
        for p in sorted((root / d).rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("generated")
    result = _gen("--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def test_committed_files_match_the_generator(generated: Path) -> None:
    fresh, committed = _tree(generated), _tree(REPO)
    assert sorted(committed) == sorted(fresh), "run: python scripts/gen_docs.py"
    drifted = [path for path in fresh if committed[path] != fresh[path]]
    assert not drifted, f"stale generated files {drifted}; run: python scripts/gen_docs.py"


def test_one_man_page_per_command_and_three_completions(generated: Path) -> None:
    files = set(_tree(generated))
    assert {"man/fairserve.1", "man/fairserve-policies.1"} <= files
    assert {
        "completions/fairserve.bash",
        "completions/_fairserve",
        "completions/fairserve.fish",
    } <= files


def test_output_is_deterministic(generated: Path, tmp_path: Path) -> None:
    assert _gen("--out", str(tmp_path)).returncode == 0
    assert _tree(tmp_path) == _tree(generated)


def test_check_passes_on_the_repository() -> None:
    result = _gen("--check")
    assert result.returncode == 0, result.stderr


def test_check_lists_changed_and_stale_files(generated: Path, tmp_path: Path) -> None:
    for d in DIRS:
        shutil.copytree(generated / d, tmp_path / d)
    (tmp_path / "man" / "fairserve.1").write_text("edited by hand\n", encoding="utf-8")
    (tmp_path / "man" / "fairserve-removed.1").write_text("old page\n", encoding="utf-8")
    result = _gen("--check", "--out", str(tmp_path))
    assert result.returncode == 1
    assert "man/fairserve.1" in result.stderr
    assert "man/fairserve-removed.1" in result.stderr
    assert (tmp_path / "man" / "fairserve.1").read_text(encoding="utf-8") == "edited by hand\n"

    assert _gen("--out", str(tmp_path)).returncode == 0  # repairs both
    assert _tree(tmp_path) == _tree(generated)


def test_policies_page_lists_every_registered_name(generated: Path) -> None:
    from fairserve.sched.registry import dispatchers, local_policies

    page = (generated / "man" / "fairserve-policies.1").read_text(encoding="utf-8")
    for name in local_policies() + dispatchers():
        roff_name = name.replace("-", "\\-")
        assert f".B {roff_name}\n" in page


@pytest.mark.parametrize(
    ("shell", "script"), [("bash", "fairserve.bash"), ("fish", "fairserve.fish")]
)
def test_committed_completions_complete_the_cli(shell: str, script: str) -> None:
    text = (REPO / "completions" / script).read_text(encoding="utf-8")
    assert complete_words(shell, text, "fairserve", "po") == ["policies"]
    assert complete_words(shell, text, "fairserve", "policies", "--j") == ["--json"]


def test_workloads_and_profiles_complete_by_name_and_as_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (REPO / "completions" / "fairserve.bash").read_text(encoding="utf-8")
    (tmp_path / "vtc-mine.toml").write_text("", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    offered = complete_words("bash", text, "fairserve", "simulate", "--workload", "vtc-")
    assert "vtc-constant" in offered and "vtc-mine.toml" in offered
    profiles = complete_words("bash", text, "fairserve", "launch", "--profile", "a100")
    assert "a100-llama-3-8b" in profiles
    clients = complete_words("bash", text, "fairserve", "router", "--clients", "vtc")
    assert clients == ["vtc-mine.toml"], "a file argument completes files"
