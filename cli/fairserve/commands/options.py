"""Options shared by several commands: names validated against the scheduling registries.

Typer (which vendors click) takes no custom click types, and an ``Enum``/``Literal``
annotation would be built on every start, loading the registries (and numpy behind them)
for ``fairserve --version``. So the names reach shell completion (and the generated
completions and man pages) through ``autocompletion``, and validation through a callback
whose message lists them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

ReportJson = Annotated[bool, typer.Option("--json", help="Print one JSON report object.")]
"""``--json`` of the commands that print a DESIGN §7 report (simulate, bench)."""

WorkloadSeed = Annotated[
    int | None, typer.Option(help="Workload seed (default: the workload's).", show_default=False)
]
"""``--seed`` of the commands that run a workload (simulate, bench)."""

ReportPlot = Annotated[
    Path | None,
    typer.Option(
        help="Write service rate and response time over time to this PNG (needs the plot extra).",
        dir_okay=False,
        show_default=False,
    ),
]
"""``--plot`` of the commands that print a DESIGN §7 report (simulate, bench)."""


def registry_option(kind: str, help_text: str) -> Any:
    """A ``typer.Option`` whose valid names (``kind``: "policy", "dispatcher" or "batching
    discipline") are read on first use."""

    def complete() -> list[str]:
        return list(registry_names(kind))

    def check(value: str) -> str:
        names = registry_names(kind)
        if value not in names:
            raise typer.BadParameter(
                f"unknown {kind} {value!r}; expected one of: {', '.join(names)}"
            )
        return value

    metavar = kind.split()[0].upper()
    return typer.Option(metavar=metavar, help=help_text, autocompletion=complete, callback=check)


def registry_names(kind: str) -> Sequence[str]:
    if kind == "batching discipline":
        from fairserve.sim.engine import BATCHING_DISCIPLINES

        return BATCHING_DISCIPLINES
    from fairserve.sched import registry

    return registry.local_policies() if kind == "policy" else registry.dispatchers()
