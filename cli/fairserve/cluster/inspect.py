"""``fairserve status``: what runs, from the run file and the router's own state.

The run file knows the processes (pids, logs, restarts); the router knows the service
(policy, dispatch, quanta, which workers it routes to). Worker health is probed directly,
so a worker the router has not re-probed yet still shows its true state. With ``--url``
there is no run file to read and the router's view is all there is.
"""

from __future__ import annotations

import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fairserve.api import paths
from fairserve.api.admin_client import AdminClient
from fairserve.cluster import runfile
from fairserve.cluster.errors import NotRunning
from fairserve.cluster.paths import run_file_path
from fairserve.cluster.runfile import RunInfo, same_process

TIMEOUT_S = 2.0


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + paths.HEALTH, timeout=1.0) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def target(url: str | None, token: str | None) -> tuple[str, str | None, RunInfo | None]:
    """The router to ask, its token, and the run file (when no --url was given)."""
    if url is not None:
        return url.rstrip("/"), token, None
    info = runfile.live_run()
    if info is None:
        raise NotRunning(
            f"nothing is running (no live run file at {run_file_path()}); "
            "start it with: fairserve launch"
        )
    return info.router_url, token or info.admin_token, info


def gather(url: str | None = None, token: str | None = None) -> dict[str, Any]:
    """The status document ``status --json`` prints. A router that does not answer raises
    ``RouterUnreachable`` (a ``ConnectionError``: exit 3), one that refuses a
    ``FairserveError`` that names it."""
    router_url, token, info = target(url, token)
    state = AdminClient(router_url, token, TIMEOUT_S).state()
    seen = {w["url"]: w for w in state.get("workers", [])}
    entries = info.workers if info is not None else []
    urls = [e.url for e in entries] + [u for u in seen if u not in {e.url for e in entries}]
    with ThreadPoolExecutor(max_workers=max(1, len(urls))) as pool:
        health = dict(zip(urls, pool.map(healthy, urls), strict=True))
    by_url = {e.url: e for e in entries}
    workers = [_worker(u, by_url.get(u), seen.get(u, {}), health[u]) for u in urls]
    return {
        "router": {"url": router_url, "healthy": healthy(router_url), **state["router"]},
        "quantum": state.get("quantum", {}),
        "engine": info.engine if info else None,
        "supervisor_pid": info.supervisor_pid if info else None,
        "run_dir": info.run_dir if info else None,
        "run_file": str(run_file_path()) if info else None,
        "ray_address": info.ray_address if info else None,
        "workers": workers,
    }


def _worker(url: str, entry: Any, routed: dict[str, Any], is_healthy: bool) -> dict[str, Any]:
    placed = entry is not None and entry.node is not None  # --ray: its pid is on its node
    alive = entry is not None and (
        entry.pid is not None if placed else same_process(entry.pid, entry.create_time) is not None
    )
    return {
        "name": entry.name if entry is not None else url,
        "url": url,
        "pid": entry.pid if alive else None,
        "managed": entry.managed if entry is not None else False,
        "healthy": is_healthy,
        "routed": bool(routed.get("healthy", False)),
        "restarts": entry.restarts if entry is not None else 0,
        "log": entry.log if entry is not None else None,
        "node": entry.node if entry is not None else None,
        "gpus": list(entry.gpus) if entry is not None else [],
        "state": entry.state if placed else None,
    }
