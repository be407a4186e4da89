"""The Ray tier: ``launch --ray`` on a real multi-node Ray cluster, all on one host.

Ray's own test utility (``ray.cluster_utils.Cluster``) starts a head node (no GPU, with the
dashboard for the state API) and two worker nodes of two *logical* GPUs each, one raylet
per node, all listening on 127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps Ray on
loopback). One cluster serves a whole test module: starting one takes seconds.

The tier is not part of the README's default ``python -m pytest`` (it needs the ``ray``
extra and a minute); it runs when named, ``python -m pytest tests/ray``, which ``.ci/run``
does after installing ``.[ray]``. Without Ray every test here skips, unless
``FAIRSERVE_REQUIRE_RAY=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ray.rig import RayRig

HERE = Path(__file__).resolve().parent

# Read once, when Ray is imported: set before any test imports it.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Collect the tier only when the command line names it (or a path inside it)."""
    named = [Path(str(arg).split("::")[0]).resolve() for arg in config.args]
    if any(path == HERE or HERE in path.parents for path in named):
        return None
    return True


def require_ray() -> Any:
    """The ``ray`` module, or a skip (a failure with ``FAIRSERVE_REQUIRE_RAY=1``)."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        if os.environ.get("FAIRSERVE_REQUIRE_RAY") == "1":
            pytest.fail("FAIRSERVE_REQUIRE_RAY=1 but Ray is not installed: pip install -e '.[ray]'")
        pytest.skip("Ray is not installed (pip install -e '.[ray]')")


@pytest.fixture(scope="module")
def rig() -> Iterator[RayRig]:
    """A head node and two nodes of two logical GPUs each, for the module's tests."""
    require_ray()
    with RayRig.start() as started:
        yield started


@pytest.fixture(autouse=True)
def private_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's run file and logs in its own directories (inherited by ``launch``)."""
    (tmp_path / "run").mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
