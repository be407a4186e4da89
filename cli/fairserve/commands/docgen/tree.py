"""A plain model of the CLI, read from the Typer app's command tree.

Man pages and completion scripts are rendered from this model rather than from Typer's
objects directly: the renderers stay simple and testable, and only this module knows how
Typer exposes options, choices and help. ``get_help_record`` is exactly what ``--help``
prints, so the man pages and ``--help`` cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer
import typer.main
from typer.core import TyperGroup, TyperOption

if TYPE_CHECKING:
    # Typer (>= 0.20) vendors click as typer._click; only the annotations need it.
    from typer._click import Command, Context, Parameter


@dataclass(frozen=True)
class ParamDoc:
    """One option or positional argument."""

    name: str
    term: str
    """What ``--help`` shows on the left, e.g. ``-m, --many <list[str]>``."""
    help: str
    """What ``--help`` shows on the right, with ``[default: …]`` and ``[env var: …]``."""
    summary: str
    """The bare help text (first line), for completion descriptions."""
    flags: tuple[str, ...] = ()
    """Option names (``-f``, ``--flag``) then negative names (``--no-flag``); empty for
    arguments."""
    takes_value: bool = False
    multiple: bool = False
    choices: tuple[str, ...] = ()
    is_path: bool = False
    envvar: str | None = None


@dataclass(frozen=True)
class CommandDoc:
    """One command or group, with its options, arguments and subcommands."""

    path: tuple[str, ...]
    """E.g. ``("fairserve", "tune", "quantum")``."""
    usage: str
    summary: str
    help: str
    options: tuple[ParamDoc, ...]
    arguments: tuple[ParamDoc, ...]
    subcommands: tuple[CommandDoc, ...] = ()

    @property
    def command_line(self) -> str:
        """``fairserve tune quantum``."""
        return " ".join(self.path)

    @property
    def page_name(self) -> str:
        """``fairserve-tune-quantum``: the man page's name."""
        return "-".join(self.path)

    def walk(self) -> Iterator[CommandDoc]:
        """This command and every command below it, depth first, in CLI order."""
        yield self
        for sub in self.subcommands:
            yield from sub.walk()


def build(app: typer.Typer, prog_name: str) -> CommandDoc:
    """Read ``app`` into a :class:`CommandDoc` tree rooted at ``prog_name``."""
    command = typer.main.get_command(app)
    # resilient_parsing: no callbacks act and missing required arguments are not errors,
    # the way click builds contexts for shell completion.
    ctx = command.make_context(prog_name, [], resilient_parsing=True)
    return _command_doc(command, ctx)


def _command_doc(command: Command, ctx: Context) -> CommandDoc:
    options: list[ParamDoc] = []
    arguments: list[ParamDoc] = []
    for param in command.get_params(ctx):
        doc = _param_doc(param, ctx)
        if doc is None:
            continue
        (options if isinstance(param, TyperOption) else arguments).append(doc)
    subcommands: list[CommandDoc] = []
    if isinstance(command, TyperGroup):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            sub_ctx = sub.make_context(name, [], parent=ctx, resilient_parsing=True)
            subcommands.append(_command_doc(sub, sub_ctx))
    usage = command.get_usage(ctx).strip().removeprefix("Usage:").strip()
    return CommandDoc(
        path=tuple(ctx.command_path.split()),
        usage=usage,
        summary=command.get_short_help_str(limit=1_000),
        help=(command.help or "").strip(),
        options=tuple(options),
        arguments=tuple(arguments),
        subcommands=tuple(subcommands),
    )


def _param_doc(param: Parameter, ctx: Context) -> ParamDoc | None:
    record = param.get_help_record(ctx)
    if record is None:  # hidden
        return None
    term, help_ = record
    raw_help = getattr(param, "help", None) or ""
    is_option = isinstance(param, TyperOption)
    takes_value = not (param.is_flag or param.count) if isinstance(param, TyperOption) else True
    choices = tuple(item.value for item in param.shell_complete(ctx, ""))
    descriptor = getattr(param, "type_descriptor", None)
    envvar = param.envvar if isinstance(param.envvar, str) else None
    return ParamDoc(
        name=param.name or "",
        term=term,
        # "\[" is rich markup's escape for a literal "[" in --help; pages show the bracket.
        help=help_.strip().replace("\\[", "["),
        summary=raw_help.strip().split("\n")[0].replace("\\[", "["),
        flags=_ordered(param.opts) + _ordered(param.secondary_opts) if is_option else (),
        takes_value=takes_value,
        multiple=param.multiple or param.nargs == -1,
        choices=choices,
        is_path=bool(
            getattr(descriptor, "is_path", False)
            or getattr(descriptor, "is_file", False)
            or "FILE" in (getattr(param, "metavar", None) or "")
        ),
        envvar=envvar,
    )


def _ordered(flags: list[str]) -> tuple[str, ...]:
    """Short flags first, then long, each sorted: Typer may hold them in a set, whose order
    changes with the hash seed, and the generated files must not."""
    return tuple(sorted(flags, key=lambda flag: (flag.startswith("--"), flag)))
