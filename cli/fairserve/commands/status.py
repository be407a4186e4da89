"""``fairserve status``: what is running: router URL, policy, dispatch, quanta, workers.

Reads the run file written by ``launch`` (or asks any router given with ``--url``). Exits 3
when nothing runs or the router does not answer, so scripts can test for a live service.
"""

from __future__ import annotations

import sys
import urllib.error
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fairserve.commands import options as opts
from fairserve.commands.errors import ExitCode
from fairserve.commands.output import Output

if TYPE_CHECKING:
    from rich.table import Table


def status(
    json_output: opts.JsonOutput = False,
    url: Annotated[
        str | None,
        opts.url_option("A router to ask instead of the one in the run file."),
    ] = None,
    token: Annotated[
        str | None,
        opts.admin_token_option("--token", "The router's admin token."),
    ] = None,
) -> None:
    """Show what is running: router URL, policy, dispatch, quanta and every worker.

    Each worker shows its pid, URL, health (probed now) and how often it was restarted.
    Exits 3 when nothing is running or the router is unreachable.
    """
    from fairserve.cluster.errors import NotRunning
    from fairserve.cluster.inspect import gather

    try:
        data = gather(url, token)
    except NotRunning as exc:
        sys.stderr.write(f"fairserve: {exc}\n")
        raise typer.Exit(ExitCode.UNAVAILABLE) from None
    except urllib.error.HTTPError:
        raise  # the router answered (e.g. 401): an error, not an unreachable router
    except (urllib.error.URLError, OSError) as exc:
        # urllib wraps "connection refused" in a URLError without an errno; the contract
        # for a router that does not answer is exit 3 with a line that names it.
        reason = getattr(exc, "reason", None) or exc
        where = url or "the launched router"
        sys.stderr.write(f"fairserve: error: router unreachable at {where}: {reason}\n")
        raise typer.Exit(ExitCode.UNAVAILABLE) from None
    out = Output(json_mode=json_output)
    out.data(data)
    out.render(_table(data))


def _table(data: dict[str, Any]) -> Table:
    from rich.table import Table

    router, quantum = data["router"], data["quantum"]
    title = (
        f"router {router['url']} ({'healthy' if router['healthy'] else 'NO HEALTHY WORKER'})  "
        f"policy {router['policy']}  dispatch {router['dispatch']}  "
        f"Q^u {_num(quantum.get('quantum'))}  Q^w {_num(quantum.get('worker_quantum'))}  "
        f"identity {router.get('auth_mode') or '-'}"
    )
    if data.get("ray_address"):
        title += f"  Ray cluster {data['ray_address']}"
    table = Table(title=title, title_justify="left", caption=_settings(router.get("settings")))
    placed = any(w.get("node") for w in data["workers"])
    columns = ["worker", "url", "pid", "health", "restarts", "log"]
    if placed:  # --ray: where each worker runs, its GPUs, and whether its node is lost
        columns[3:3] = ["node", "gpus", "state"]
    for column in columns:
        table.add_column(column, no_wrap=column != "log")
    for w in data["workers"]:
        health = "healthy" if w["healthy"] else "DOWN"
        pid = "-" if w["pid"] is None else str(w["pid"])
        row = [w["name"], w["url"], pid, health, str(w["restarts"]), w["log"] or "-"]
        if placed:
            gpus = ",".join(map(str, w.get("gpus") or [])) or "-"
            row[3:3] = [(w.get("node") or "-")[:12], gpus, w.get("state") or "-"]
        table.add_row(*row)
    return table


def _settings(view: Any) -> str:
    """Where the live weights and quanta come from (``router.persist``)."""
    if not isinstance(view, dict) or not view.get("file"):
        return "live settings: not kept across restarts (router without --settings)"
    origin = "restored from" if view.get("restored_at_start") else "kept in"
    changed = view.get("live_weights") or {}
    weights = ", ".join(f"{name}={w:g}" for name, w in changed.items()) or "none"
    return f"live settings {origin} {view['file']}; weights changed live: {weights}"


def _num(value: object) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
