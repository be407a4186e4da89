"""The layering of DESIGN §3, enforced.

``core`` and ``sched`` are reused unchanged inside the simulator, the router and SGLang's
scheduler process, so they must not drag in UI, HTTP, GPU or CLI libraries. Two checks:
import-linter's contracts (``[tool.importlinter]`` in pyproject.toml, direct imports, whole
layer graph) and a fresh interpreter that imports every headless module and looks at what
was actually loaded (catches indirect and dynamic imports too).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

FORBIDDEN = frozenset(
    {"textual", "rich", "aiohttp", "pynvml", "sglang", "typer", "click", "psutil"}
    | {"prometheus_client", "uvloop"}
)

HEADLESS_IMPORTS = """
import importlib, json, pkgutil, sys
import fairserve.api, fairserve.core, fairserve.sched, fairserve.workloads, fairserve.sim
names = []
for package in (fairserve.api, fairserve.core, fairserve.sched, fairserve.workloads, fairserve.sim):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)
        names.append(info.name)
from fairserve.sched import registry
registry.load_all()
print(json.dumps({"imported": names, "loaded": sorted(sys.modules)}))
"""


def _lint_imports(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )


def test_import_contracts_are_kept() -> None:
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_import_contracts_can_break(tmp_path: Path) -> None:
    """The contracts are live: a copy of the tree with two bad imports fails both."""
    shutil.copytree(REPO / "cli", tmp_path / "cli", ignore=shutil.ignore_patterns("*.egg-info"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    core = tmp_path / "cli" / "fairserve" / "core" / "errors.py"
    core.write_text(core.read_text(encoding="utf-8") + "\nimport rich  # bad\n", encoding="utf-8")
    sched = tmp_path / "cli" / "fairserve" / "sched" / "params.py"
    sched.write_text(
        sched.read_text(encoding="utf-8") + "\nimport fairserve.commands  # bad\n",
        encoding="utf-8",
    )
    env = {"PATH": str(LINT_IMPORTS.parent), "PYTHONPATH": str(tmp_path / "cli")}
    result = _lint_imports(tmp_path, env)
    assert result.returncode == 1, result.stdout + result.stderr
    # Two bad imports break the two contracts they cross; the others stay kept.
    assert "4 kept, 2 broken" in result.stdout


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (so nothing this test process imported counts)."""
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result


def test_headless_packages_load_no_ui_network_or_gpu_library() -> None:
    result = _run_python(HEADLESS_IMPORTS)
    report = json.loads(result.stdout)
    assert "fairserve.sched.registry" in report["imported"]
    assert "fairserve.core.types" in report["imported"]
    assert "fairserve.api.worker_extension" in report["imported"]
    loaded = report["loaded"]
    offenders = [m for m in loaded if m.split(".")[0] in FORBIDDEN]
    assert not offenders, f"headless packages loaded {offenders}"
    assert not [m for m in loaded if m.startswith("fairserve.commands")]


ROUTER_IMPORTS = """
import importlib, json, pkgutil, sys
import fairserve.router
for info in pkgutil.walk_packages(fairserve.router.__path__, "fairserve.router."):
    importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""


def test_router_loads_no_ui_gpu_or_cli_library() -> None:
    """The router is a headless server: aiohttp and prometheus-client, never a UI, NVML,
    the CLI or the simulated worker (layering: router and worker are not each other's)."""
    result = _run_python(ROUTER_IMPORTS)
    loaded = json.loads(result.stdout)
    assert "fairserve.router.server" in loaded and "aiohttp" in loaded
    forbidden = {"textual", "rich", "pynvml", "sglang", "typer", "click", "psutil"}
    offenders = [m for m in loaded if m.split(".")[0] in forbidden]
    assert not offenders, f"fairserve.router loaded {offenders}"
    assert not [m for m in loaded if m.startswith(("fairserve.commands", "fairserve.worker"))]
    assert not [m for m in loaded if m.startswith("fairserve.sim")]
