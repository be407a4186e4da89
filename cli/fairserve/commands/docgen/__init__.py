"""Generate the man pages and shell completions from the Typer app itself.

Hand-written docs drift from the CLI; these are rebuilt from the command tree and the policy
registries by ``scripts/gen_docs.py`` and committed, and ``tests/cli/test_generated_docs.py``
fails while the committed files differ from what this module produces. :func:`generate`
returns every file as text keyed by its path relative to the repository root; :func:`drift`
and :func:`write` compare with or update a tree on disk.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import fairserve
from fairserve.commands.docgen import completion, man, pages
from fairserve.commands.docgen.man import Section
from fairserve.commands.docgen.tree import CommandDoc, build

OUTPUT_DIRS = ("man", "completions")
"""Directories owned by the generator: every file in them is generated."""


def _policy_sections() -> tuple[Section, ...]:
    from fairserve.commands.policies import format_param
    from fairserve.sched.registry import describe_all

    described = describe_all()

    def entries(kind: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
        return tuple(
            (e["name"], (e["description"], *(format_param(p) for p in e["params"])))
            for e in described[kind]
        )

    return (
        Section(
            "Local policies",
            "Registered local policies, with their parameters (name=default: meaning).",
            entries("local_policies"),
        ),
        Section(
            "Dispatchers",
            "Registered dispatchers, with their parameters (name=default: meaning).",
            entries("dispatchers"),
        ),
    )


EXTRA_SECTIONS: dict[str, Callable[[], tuple[Section, ...]]] = {
    "fairserve policies": _policy_sections,
}
"""Command line → extra man sections built from a registry (names users type)."""


def generate() -> dict[str, str]:
    """Every generated file: relative path → content."""
    from fairserve.commands.app import PROG_NAME, app

    root = build(app, PROG_NAME)
    parents: dict[tuple[str, ...], CommandDoc] = {
        sub.path: cmd for cmd in root.walk() for sub in cmd.subcommands
    }
    files: dict[str, str] = {}
    for cmd in root.walk():
        extra = EXTRA_SECTIONS.get(cmd.command_line, tuple)() + pages.sections(cmd.command_line)
        files[f"man/{cmd.page_name}.1"] = man.render(
            cmd, version=fairserve.__version__, parent=parents.get(cmd.path), extra=extra
        )
    files[f"completions/{PROG_NAME}.bash"] = completion.bash(root)
    files[f"completions/_{PROG_NAME}"] = completion.zsh(root)
    files[f"completions/{PROG_NAME}.fish"] = completion.fish(root)
    return files


def drift(root: Path, files: Mapping[str, str]) -> list[str]:
    """Paths under ``root`` that differ from ``files``: changed, missing, or stale extras."""
    drifted = [
        path
        for path, content in files.items()
        if not (root / path).is_file() or (root / path).read_text(encoding="utf-8") != content
    ]
    drifted += [path for path in _existing(root) if path not in files]
    return sorted(drifted)


def write(root: Path, files: Mapping[str, str]) -> list[str]:
    """Bring ``root`` in line with ``files`` (write changed, delete stale); return what changed."""
    changed = drift(root, files)
    for path in changed:
        target = root / path
        if path in files:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(files[path], encoding="utf-8")
        else:
            target.unlink()
    return changed


def _existing(root: Path) -> list[str]:
    return [
        p.relative_to(root).as_posix()
        for d in OUTPUT_DIRS
        if (root / d).is_dir()
        for p in sorted((root / d).rglob("*"))
        if p.is_file()
    ]
