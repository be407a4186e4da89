"""The pinned SGLang wheel, downloaded once (no dependencies) and read as source with ``ast``.

Nothing from the wheel is imported or executed: SGLang needs CUDA libraries and hundreds of
megabytes of dependencies; its *source* is all the contract needs. The wheel is cached in the
temporary directory under a name that carries the version, so a test session downloads it at
most once and a new pin downloads a new one.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from fairserve.sglang.targets import SGLANG_VERSION

CACHE_DIR = Path(tempfile.gettempdir()) / f"fairserve-sglang-wheel-{SGLANG_VERSION}"
DOWNLOAD = [
    "download", "--no-deps", "--only-binary=:all:", "--platform", "manylinux_2_34_x86_64",
    "--python-version", "3.11", "--implementation", "cp", f"sglang=={SGLANG_VERSION}",
    "--timeout", "30", "--retries", "1", "--quiet", "--disable-pip-version-check",
]  # fmt: skip
"""One fixed platform, so every machine reads the same wheel (the source is the same in all
of them; only the compiled extensions differ)."""

UNREACHABLE = re.compile(
    r"Max retries exceeded|NewConnectionError|Temporary failure in name resolution|"
    r"Name or service not known|Network is unreachable|Connection refused|timed out|"
    r"ConnectTimeout|ProxyError|Could not fetch URL",
    re.IGNORECASE,
)


class Unreachable(Exception):
    """The package index cannot be reached (the only reason the contract test may skip)."""


def pinned_wheel() -> Path:
    """The cached wheel, downloading it first when needed."""
    found = sorted(CACHE_DIR.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if found:
        return found[0]
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="download-", dir=CACHE_DIR))
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", *DOWNLOAD, "-d", str(staging)],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        wheels = sorted(staging.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
        if result.returncode != 0 or not wheels:
            output = result.stdout + result.stderr
            if UNREACHABLE.search(output):
                raise Unreachable(f"PyPI unreachable: {output.strip()[-300:]}")
            raise RuntimeError(f"pip download sglang=={SGLANG_VERSION} failed:\n{output}")
        target = CACHE_DIR / wheels[0].name
        os.replace(wheels[0], target)  # atomic: a parallel session sees all of it or nothing
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class WheelSource:
    """Parsed modules of the wheel, by dotted name."""

    def __init__(self, wheel: Path) -> None:
        self.zip = zipfile.ZipFile(wheel)
        self.names = set(self.zip.namelist())
        self._parsed: dict[str, ast.Module] = {}

    def path(self, module: str) -> str | None:
        """Where a module's source lives in the wheel (a package: its ``__init__.py``)."""
        base = module.replace(".", "/")
        for candidate in (base + ".py", base + "/__init__.py"):
            if candidate in self.names:
                return candidate
        return None

    def has(self, module: str) -> bool:
        return self.path(module) is not None

    def module(self, module: str) -> ast.Module:
        if module not in self._parsed:
            path = self.path(module)
            if path is None:
                raise AssertionError(f"module {module} is not in the wheel")
            self._parsed[module] = ast.parse(self.zip.read(path).decode("utf-8"), filename=path)
        return self._parsed[module]

    def modules_under(self, package: str) -> list[str]:
        prefix = package.replace(".", "/") + "/"
        return sorted(
            n[:-3].replace("/", ".")
            for n in self.names
            if n.startswith(prefix) and n.endswith(".py") and "/" not in n[len(prefix) :]
        )

    def find_class(self, module: str, name: str) -> tuple[str, ast.ClassDef] | None:
        """The class ``name`` defined in ``module`` or imported there (followed once)."""
        tree = self.module(module)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for imported in ast.walk(tree):
            if (
                isinstance(imported, ast.ImportFrom)
                and imported.module
                and imported.level == 0
                and any((a.asname or a.name) == name for a in imported.names)
                and self.has(imported.module)
            ):
                return self.find_class(imported.module, name)
        return None

    def class_chain(self, module: str, name: str) -> list[tuple[str, ast.ClassDef]]:
        """The class and its base classes that can be found in the wheel (for inherited
        methods and attributes)."""
        found = self.find_class(module, name)
        if found is None:
            return []
        chain = [found]
        where, cls = found
        for base in cls.bases:
            if isinstance(base, ast.Name):
                chain += self.class_chain(where, base.id)
        return chain


def method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    return None


def positional_params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in (*func.args.posonlyargs, *func.args.args)]


def class_attributes(cls: ast.ClassDef) -> set[str]:
    """Names defined in the class body and every ``self.name`` assigned in its methods."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for assigned in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(assigned, ast.Assign):
            targets = list(assigned.targets)
        elif isinstance(assigned, ast.AnnAssign | ast.AugAssign):
            targets = [assigned.target]
        for target in targets:
            for leaf in ast.walk(target):
                if (
                    isinstance(leaf, ast.Attribute)
                    and isinstance(leaf.value, ast.Name)
                    and leaf.value.id == "self"
                ):
                    names.add(leaf.attr)
    return names
