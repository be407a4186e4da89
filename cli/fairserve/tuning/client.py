"""The router's admin API as the tuner sees it: :mod:`fairserve.api.admin_client`, found
through the run file or ``--url``.

The client itself (state, quanta, weights over ``urllib``, with errors that name the
router and say what to do) is the one ``status`` uses too; this module only adds how
``tune`` finds the router.
"""

from __future__ import annotations

from fairserve.api.admin_client import TIMEOUT_S as TIMEOUT_S
from fairserve.api.admin_client import TOKEN_HINT as TOKEN_HINT
from fairserve.api.admin_client import AdminClient
from fairserve.api.admin_client import AdminRefused as AdminRefused
from fairserve.api.admin_client import RouterUnreachable as RouterUnreachable
from fairserve.cluster import runfile
from fairserve.cluster.errors import NotRunning
from fairserve.cluster.paths import run_file_path


def connect(url: str | None, token: str | None, timeout_s: float = TIMEOUT_S) -> AdminClient:
    """The router given with ``--url``, else the one in the run file ``launch`` wrote (with
    its admin token unless ``--token`` overrides it); :class:`NotRunning` when neither."""
    if url is not None:
        return AdminClient(url.rstrip("/"), token, timeout_s)
    info = runfile.live_run()
    if info is None:
        raise NotRunning(
            f"nothing is running (no live run file at {run_file_path()}): start it with "
            "fairserve launch, or give the router with --url"
        )
    return AdminClient(info.router_url.rstrip("/"), token or info.admin_token, timeout_s)
