"""The ``fairserve`` command line: the Typer app, global options and the process entry point.

Commands live one per module in this package and are registered in :data:`COMMANDS`, so this
file is the table of contents of the CLI. :func:`main` is the console script: it runs the app
and sends every exception that escapes a command through :mod:`fairserve.commands.errors`,
the single place that picks exit codes and messages.

Kept cheap to import: ``fairserve --version`` and ``--help`` must answer instantly, so
command modules import their heavy dependencies inside the command functions.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, NoReturn

import typer

import fairserve
from fairserve.commands import (
    bench,
    launch,
    policies,
    profile,
    router,
    simulate,
    status,
    stop,
    top,
    tune,
    worker,
)
from fairserve.commands.errors import ExitCode, report

PROG_NAME = "fairserve"

COMMANDS: dict[str, Callable[..., None]] = {
    "launch": launch.launch,
    "status": status.status,
    "stop": stop.stop,
    "top": top.top,
    "simulate": simulate.simulate,
    "worker": worker.worker,
    "router": router.router,
    "bench": bench.bench,
    "policies": policies.policies,
}
"""Command name → Typer command function (its docstring is the help text)."""

GROUPS: dict[str, typer.Typer] = {
    "tune": tune.app,
    "profile": profile.app,
}
"""Command name → Typer group, for commands with subcommands (``tune quantum``)."""


@dataclass
class GlobalOptions:
    """Options given before the subcommand; read by :func:`run` after a command fails."""

    debug: bool = False


def help_text(func: Callable[..., object]) -> str:
    """A function's docstring as help, paragraphs reflowed.

    Typer keeps single line breaks, so wrapped source lines would show up as ragged breaks in
    ``--help`` and in the generated man pages.
    """
    paragraphs = inspect.cleandoc(func.__doc__ or "").split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def _print_version(ctx: typer.Context, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        typer.echo(f"{PROG_NAME} {fairserve.__version__}")
        raise typer.Exit()


def root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            expose_value=False,
            help="Print the version and exit.",
        ),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option("--debug", envvar="FAIRSERVE_DEBUG", help="Show a traceback on failure."),
    ] = False,
) -> None:
    """Run a shared LLM service fairly: fair, prefix-cache-aware routing and scheduling.

    Data goes to stdout (tables, or JSON with --json), diagnostics to stderr.
    """
    ctx.ensure_object(GlobalOptions).debug = debug


def _exit_codes_line() -> str:
    codes = ", ".join(f"{code.value} {code.name.lower()}" for code in ExitCode)
    return f"Exit codes: {codes}."


app = typer.Typer(
    name=PROG_NAME,
    # Completion scripts are generated statically into completions/ (scripts/gen_docs.py),
    # so they can list registry names; Typer's runtime installer would duplicate that.
    add_completion=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    # Failures are reported by fairserve.commands.errors; Typer's pretty tracebacks would
    # show one for every failure, which only --debug should do.
    pretty_exceptions_enable=False,
)
app.callback(help=f"{help_text(root)} {_exit_codes_line()}")(root)
for _name, _func in COMMANDS.items():
    app.command(_name, help=help_text(_func))(_func)
for _name, _group in GROUPS.items():
    app.add_typer(_group, name=_name)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit code.

    Usage errors (unknown command or option) are reported by Typer itself with exit code 2;
    everything a command raises is reported by :func:`fairserve.commands.errors.report`.
    """
    options = GlobalOptions()
    command = typer.main.get_command(app)
    args = list(argv) if argv is not None else None
    try:
        command.main(args=args, prog_name=PROG_NAME, obj=options, standalone_mode=True)
    except SystemExit as exc:
        return _exit_status(exc.code)
    except BaseException as exc:  # the one place that turns exceptions into exit codes
        return report(exc, debug=options.debug, stderr=sys.stderr)
    return ExitCode.OK


def _exit_status(code: str | int | None) -> int:
    if code is None:
        return ExitCode.OK
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{PROG_NAME}: {code}\n")
    return ExitCode.ERROR


def main() -> NoReturn:
    """Console-script entry point (``fairserve = fairserve.commands.app:main``)."""
    sys.exit(run())
