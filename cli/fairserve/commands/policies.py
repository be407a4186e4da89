"""``fairserve policies``: the local policies and dispatchers users can pick.

Everything printed comes from :func:`fairserve.sched.registry.describe_all`, the same
registry the simulator, the router and the plugin build policies from, so this list can never
name a policy that does not exist or miss one that does. The registry is imported inside the
command so that ``fairserve --help`` does not load every policy module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from fairserve.commands.output import Output

if TYPE_CHECKING:
    from rich.table import Table


def policies(
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print one JSON object {"local_policies": [...], "dispatchers": [...]}.',
        ),
    ] = False,
) -> None:
    """List local policies and dispatchers with their parameters.

    A local policy decides which waiting requests one engine admits at each batching step; a
    dispatcher decides which worker an arriving request goes to. The names listed here are
    the ones every other command accepts.
    """
    from fairserve.sched.registry import describe_all

    described = describe_all()
    out = Output(json_mode=json_output)
    out.data(described)
    out.render(
        _table("Local policies", described["local_policies"]),
        _table("Dispatchers", described["dispatchers"]),
        _legend(described),
    )


def _table(title: str, entries: list[dict[str, Any]]) -> Table:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("description")
    table.add_column("parameters", no_wrap=True)
    for entry in entries:
        params = "\n".join(f"{p['name']}={p['default']}" for p in entry["params"]) or "-"
        table.add_row(entry["name"], entry["description"], params)
    return table


def _legend(described: dict[str, list[dict[str, Any]]]) -> Table:
    """One row per distinct parameter meaning, with the policies that take it.

    ``w_e``/``w_q`` and friends recur across policies with the same meaning, so explaining
    them once keeps the tables above narrow enough for a terminal.
    """
    from rich.table import Table

    users: dict[tuple[str, str, str], list[str]] = {}
    for entry in (*described["local_policies"], *described["dispatchers"]):
        for param in entry["params"]:
            key = (param["name"], param_range(param), param["description"])
            users.setdefault(key, []).append(entry["name"])
    table = Table(title="Parameters", title_justify="left")
    table.add_column("parameter", style="bold", no_wrap=True)
    table.add_column("meaning", ratio=2)
    table.add_column("taken by", ratio=1)
    for (name, valid, description), owners in sorted(users.items()):
        table.add_row(f"{name} {valid}".strip(), description, ", ".join(owners))
    return table


def param_range(param: dict[str, Any]) -> str:
    """``(> 0)`` / ``(>= 0)`` from a ``Param.describe()`` dict, or ``""`` without a minimum."""
    if "minimum" not in param:
        return ""
    op = ">" if param.get("exclusive_minimum") else ">="
    return f"({op} {param['minimum']:g})"


def format_param(param: dict[str, Any]) -> str:
    """``quantum=512.0 (> 0): deficit quantum ...`` from a ``Param.describe()`` dict."""
    head = f"{param['name']}={param['default']} {param_range(param)}".strip()
    return f"{head}: {param['description']}"
