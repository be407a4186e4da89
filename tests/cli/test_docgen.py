"""The man-page and completion renderers, on a demo app richer than today's CLI.

Later commands bring nested groups (``tune quantum``), choices, paths and positional
arguments; the renderers are exercised on all of them here, and the scripts are run by the
real shells where installed.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import pytest
import typer

from fairserve.commands.docgen import completion, man, pages
from fairserve.commands.docgen.tree import CommandDoc, build
from tests.cli.conftest import complete_words


class Policy(StrEnum):
    dlpm = "dlpm"
    vtc = "vtc"


def _demo_app() -> typer.Typer:
    app = typer.Typer(
        add_completion=False, context_settings={"help_option_names": ["-h", "--help"]}
    )
    tune = typer.Typer(help="Tune the fairness quanta.")

    @app.callback()
    def root(debug: Annotated[bool, typer.Option("--debug", help="Tracebacks.")] = False) -> None:
        """The demo tool."""

    @app.command("simulate")
    def simulate(
        workload: Annotated[Path, typer.Argument(help="Workload file.")],
        policy: Annotated[Policy, typer.Option("--policy", "-p", help="Local policy.")] = (
            Policy.dlpm
        ),
        plot: Annotated[Path | None, typer.Option("--plot", help="Write a chart.")] = None,
        seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
        fast: Annotated[bool, typer.Option("--fast/--slow", help="Go fast.")] = False,
    ) -> None:
        """Run a workload through the simulator."""

    @tune.command("quantum")
    def quantum(
        value: Annotated[float | None, typer.Argument(help="The quantum Q^u.")] = None,
        worker: Annotated[float | None, typer.Option("--worker", help="Q^w: it's [big].")] = None,
    ) -> None:
        """Set or show the quantum."""

    app.add_typer(tune, name="tune")
    return app


@pytest.fixture(scope="module")
def demo() -> CommandDoc:
    return build(_demo_app(), "demo")


def test_tree_reads_commands_options_and_choices(demo: CommandDoc) -> None:
    assert [c.command_line for c in demo.walk()] == [
        "demo",
        "demo simulate",
        "demo tune",
        "demo tune quantum",
    ]
    simulate = demo.subcommands[0]
    options = {p.name: p for p in simulate.options}
    assert options["policy"].flags == ("-p", "--policy")
    assert options["policy"].choices == ("dlpm", "vtc")
    assert options["policy"].takes_value
    assert options["plot"].is_path
    assert options["fast"].flags == ("--fast", "--slow")
    assert not options["fast"].takes_value
    assert "-h" in options["help"].flags
    assert [a.name for a in simulate.arguments] == ["workload"]
    assert simulate.arguments[0].is_path


def test_man_pages_are_valid_roff(demo: CommandDoc) -> None:
    pages = {cmd.page_name: man.render(cmd, version="9.9") for cmd in demo.walk()}
    assert '.TH "DEMO\\-TUNE\\-QUANTUM" "1" "" "fairserve 9.9"' in pages["demo-tune-quantum"]
    assert "\\fBdemo\\-tune\\-quantum\\fR(1)" in pages["demo-tune"]  # SEE ALSO the child
    assert ".SH EXIT STATUS" in pages["demo"]
    groff = shutil.which("groff")
    if groff is None:
        pytest.skip("groff not installed")
    for name, page in pages.items():
        result = subprocess.run(
            [groff, "-man", "-Tutf8", "-ww", "-z"],
            input=page,
            capture_output=True,
            text=True,
            check=False,
        )
        assert (result.returncode, result.stderr) == (0, ""), name


def test_roff_escapes_leading_dots_and_backslashes() -> None:
    assert man.escape(".hidden\n'quote\na\\b-c") == "\\&.hidden\n\\&'quote\na\\eb\\-c"


@pytest.mark.parametrize(
    ("shell", "render"), [("bash", completion.bash), ("fish", completion.fish)]
)
@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (("demo", ""), ["simulate", "tune"]),
        (("demo", "--debug", "t"), ["tune"]),
        (("demo", "--"), ["--debug", "--help"]),
        (("demo", "tune", ""), ["quantum"]),
        (("demo", "simulate", "--policy", ""), ["dlpm", "vtc"]),
        (("demo", "simulate", "-p", "v"), ["vtc"]),
        (("demo", "simulate", "--seed", "3", "--f"), ["--fast"]),
        (("demo", "tune", "quantum", "--w"), ["--worker"]),
        # an option's value is skipped when finding the subcommand
        (("demo", "simulate", "--seed", "tune", "--po"), ["--policy"]),
    ],
)
def test_completion_completes(
    demo: CommandDoc,
    shell: str,
    render: Callable[[CommandDoc], str],
    words: tuple[str, ...],
    expected: list[str],
) -> None:
    assert complete_words(shell, render(demo), *words) == expected


def test_bash_completes_paths(demo: CommandDoc, tmp_path: Path) -> None:
    (tmp_path / "load.toml").write_text("", encoding="utf-8")
    got = complete_words(
        "bash", completion.bash(demo), "demo", "simulate", "--plot", f"{tmp_path}/lo"
    )
    assert got == [f"{tmp_path}/load.toml"]


@pytest.mark.parametrize(
    ("shell", "render", "check"),
    [
        ("bash", completion.bash, ["-n"]),
        ("zsh", completion.zsh, ["-n"]),
        ("fish", completion.fish, ["--no-execute"]),
    ],
)
def test_completion_scripts_parse(
    demo: CommandDoc,
    tmp_path: Path,
    shell: str,
    render: Callable[[CommandDoc], str],
    check: list[str],
) -> None:
    exe = shutil.which(shell)
    if exe is None:
        pytest.skip(f"{shell} not installed")
    script = tmp_path / "script"
    script.write_text(render(demo), encoding="utf-8")
    result = subprocess.run([exe, *check, str(script)], capture_output=True, text=True, check=False)
    assert (result.returncode, result.stderr) == (0, "")


def test_zsh_and_fish_name_every_choice_and_subcommand(demo: CommandDoc) -> None:
    for script in (completion.zsh(demo), completion.fish(demo)):
        for word in (
            "simulate",
            "tune",
            "quantum",
            "dlpm vtc",
            "--policy" if "#compdef" in script else "-l policy",
        ):
            assert word in script
    assert "'(-p --policy)'{-p,--policy}" in completion.zsh(demo)
    assert "Q^w: it\\'s [big]." in completion.fish(demo)
    assert "Q^w: it'\\''s \\[big\\]." in completion.zsh(demo)


@pytest.mark.parametrize(
    "example", [cmd for examples in pages.EXAMPLES.values() for cmd, _ in examples]
)
def test_every_man_page_example_names_only_real_options(example: str) -> None:
    """An example with ``--help`` appended parses: every option in it exists (click stops
    at the first unknown option with a usage error, exit 2)."""
    from typer.testing import CliRunner

    from fairserve.commands.app import app

    words = shlex.split(example)
    assert words[0] == "fairserve"
    result = CliRunner().invoke(app, [*words[1:], "--help"])
    assert result.exit_code == 0, (example, result.output)


def test_command_pages_have_examples_and_files() -> None:
    from fairserve.commands.docgen import generate

    files = generate()
    for command_line in pages.EXAMPLES:
        page = files[f"man/{command_line.replace(' ', '-')}.1"]
        assert ".SH EXAMPLES" in page, command_line
    assert ".SH FILES" in files["man/fairserve-launch.1"]
    assert "run.json" in files["man/fairserve-status.1"]
