"""The README's test command (``pip install -e '.[test]' && python -m pytest``) must pass in
a fresh virtual environment, so the ``test`` extra must provide every third-party module the
suite and the code it exercises import, even lazily inside a function (matplotlib once lived
only in ``dev``, and a fresh venv failed 12 tests). CI also builds such a venv (``.ci/run``);
this check is the cheap, offline one: it fails the moment an import outgrows the extra.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Installed only by their own extra; every test that needs them skips without them (ray:
# ``launch --ray`` and its tier tests/ray, which .ci/run runs after installing ``.[ray]``).
OPTIONAL_DISTRIBUTIONS = {"sglang", "ray"}


def _dist_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match is not None, requirement
    return match.group(0).lower().replace("_", "-")


def _requirements(extra: str, project: dict[str, object]) -> set[str]:
    """Distribution names the core dependencies plus ``extra`` install (self-references
    such as ``fairserve[plot]`` resolved)."""
    extras = project["optional-dependencies"]
    assert isinstance(extras, dict)
    names: set[str] = set()
    pending = [extra]
    while pending:
        for requirement in extras[pending.pop()]:
            self_ref = re.fullmatch(r"fairserve\[([a-z0-9,\s-]+)\]", requirement)
            if self_ref:
                pending.extend(part.strip() for part in self_ref.group(1).split(","))
            else:
                names.add(_dist_name(requirement))
    dependencies = project["dependencies"]
    assert isinstance(dependencies, list)
    return names | {_dist_name(requirement) for requirement in dependencies}


def _installed_closure(names: set[str]) -> set[str]:
    """``names`` plus what they pull in (their unconditional requirements, transitively),
    as a fresh venv would hold them; a distribution not installed here adds nothing."""
    closure: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name in closure:
            continue
        closure.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        pending.extend(_dist_name(req) for req in requires if "extra ==" not in req)
    return closure


def _imported_top_modules(*roots: Path) -> dict[str, Path]:
    """Every absolute import's top-level module under ``roots`` -> one file importing it."""
    found: dict[str, Path] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    found.setdefault(module.split(".")[0], path)
    return found


def _pyproject() -> dict[str, object]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert isinstance(project, dict)
    return project


def test_test_extra_provides_every_third_party_import() -> None:
    provided = _installed_closure(_requirements("test", _pyproject()))
    module_dists = importlib.metadata.packages_distributions()
    local = {"fairserve", "tests", "__future__"}
    missing = []
    for module, path in _imported_top_modules(ROOT / "cli", ROOT / "tests").items():
        if module in sys.stdlib_module_names or module in local:
            continue
        dists = {_dist_name(dist) for dist in module_dists.get(module, [])}
        if not dists or dists & (provided | OPTIONAL_DISTRIBUTIONS):
            continue  # not installed here (an optional engine), or provided
        where = path.relative_to(ROOT)
        missing.append(f"{module} ({', '.join(sorted(dists))}) imported by {where}")
    assert not missing, "the 'test' extra lacks: " + "; ".join(sorted(missing))


def test_dev_extra_is_test_plus_tools() -> None:
    project = _pyproject()
    assert _requirements("test", project) <= _requirements("dev", project)
