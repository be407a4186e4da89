"""Built-in workloads (``workloads/builtin/*.toml``, shipped as package data) and name
resolution: the CLI accepts a workload file, a trace file or a built-in's name."""

from __future__ import annotations

import tomllib
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from fairserve.core.errors import UnknownNameError
from fairserve.workloads.model import Workload
from fairserve.workloads.synthetic import SyntheticWorkload, load_workload, loads_workload
from fairserve.workloads.trace import load_trace


def _builtin_dir() -> Traversable:
    return resources.files("fairserve.workloads").joinpath("builtin")


def _builtin_files() -> dict[str, Traversable]:
    return {
        entry.name.removesuffix(".toml"): entry
        for entry in _builtin_dir().iterdir()
        if entry.name.endswith(".toml")
    }


def builtin_names() -> list[str]:
    """Names of the built-in workloads, sorted."""
    return sorted(_builtin_files())


def list_builtin() -> list[tuple[str, str]]:
    """``(name, description)`` of every built-in workload, sorted by name."""
    out = []
    for name, entry in sorted(_builtin_files().items()):
        data = tomllib.loads(entry.read_text(encoding="utf-8"))
        description = data.get("description", "")
        out.append((name, description if isinstance(description, str) else ""))
    return out


def builtin_text(name: str) -> str:
    """The TOML text of a built-in (a starting point for a custom workload file)."""
    entry = _builtin_files().get(name)
    if entry is None:
        raise UnknownNameError("workload", name, builtin_names())
    return entry.read_text(encoding="utf-8")


def load_builtin(name: str) -> SyntheticWorkload:
    return loads_workload(builtin_text(name), f"<builtin>/{name}.toml")


def resolve_workload(name_or_path: str | Path) -> Workload:
    """A trace (``*.jsonl``), a workload file (an existing file, or anything ending in
    ``.toml``) or a built-in's name; unknown names raise ``UnknownNameError``."""
    text = str(name_or_path)
    if text.endswith(".jsonl"):
        return load_trace(text)
    if isinstance(name_or_path, Path) or text.endswith(".toml") or Path(text).is_file():
        return load_workload(text)
    return load_builtin(text)
