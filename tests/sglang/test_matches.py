"""Kept matches are used only on the radix cache shape whose matching they mirror; on any
other (SWA or Mamba components, HiCache, an external linker, EAGLE keys, the Rust tree
core, SGLang's forced misses) the host tells the policy SGLang's own ``prefix_len``.
Equality with SGLang's matching on the supported shape: ``tests/sglang_real/test_matches``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from fairserve.sglang.matches import FORCE_MISS_ENV, KeptMatches


def shaped(name: str, **fields: Any) -> Any:
    """An object of a class called ``name`` (the guard checks SGLang's class names)."""
    return type(name, (SimpleNamespace,), {})(**fields)


def cache(**changes: Any) -> Any:
    core_fields: dict[str, Any] = {
        "root_node": SimpleNamespace(key=SimpleNamespace(), children={}),
        "page_size": 1,
        "enable_hicache": False,
        "is_eagle": False,
        "components": (shaped("FullComponent"),),
        "_node_arena": {},
    }
    core_fields.update(changes.pop("core", {}))
    core = shaped(changes.pop("core_class", "UnifiedTreeCore"), **core_fields)
    name = changes.pop("cache_class", "UnifiedRadixCache")
    fields: dict[str, Any] = {"tree_core": core, "disable": False, "linker": None}
    fields.update(changes)
    return shaped(name, **fields)


def test_the_mirrored_shape_is_supported() -> None:
    assert KeptMatches().begin(cache()) is not None


@pytest.mark.parametrize(
    "changes",
    [
        {"cache_class": "RadixCache"},
        {"core_class": "RustTreeCore"},
        {"disable": True},
        {"linker": object()},
        {"core": {"enable_hicache": True}},
        {"core": {"is_eagle": True}},
        {"core": {"components": (shaped("FullComponent"), shaped("SWAComponent"))}},
        {"core": {"components": (shaped("MambaComponent"),)}},
    ],
    ids=["legacy-cache", "rust-core", "disabled", "linker", "hicache", "eagle", "swa", "mamba"],
)
def test_other_shapes_fall_back_to_sglangs_prefix_len(changes: dict[str, Any]) -> None:
    assert KeptMatches().begin(cache(**changes)) is None


def test_no_cache_and_forced_misses_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    assert KeptMatches().begin(None) is None
    monkeypatch.setenv(FORCE_MISS_ENV, "1")
    assert KeptMatches().begin(cache()) is None
