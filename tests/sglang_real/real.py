"""Whether this tier can run: SGLang (the pinned release) must import.

The main test environment has no SGLang (it is 11 GB with CUDA libraries), so there every
module of the tier is reported as skipped, with the reason. ``.ci/run`` runs the tier in a
second environment with ``.[sglang]`` and sets ``FAIRSERVE_REQUIRE_SGLANG=1``: there a
missing or wrong SGLang fails the run instead of skipping it silently.
"""

from __future__ import annotations

import os

import pytest

from fairserve.sglang.targets import SGLANG_VERSION, TREE_CORE_BACKEND, TREE_CORE_ENV

REQUIRE_ENV = "FAIRSERVE_REQUIRE_SGLANG"


def require_sglang() -> None:
    """Skip the calling test module (module level) unless SGLang imports; with
    ``FAIRSERVE_REQUIRE_SGLANG=1`` fail instead. Selects SGLang's Python radix tree core
    (read when a cache is built; the plugin's evictions need it)."""
    required = os.environ.get(REQUIRE_ENV, "") not in ("", "0")
    try:
        import sglang
    except ImportError as exc:
        if required:
            raise RuntimeError(f"{REQUIRE_ENV} is set but SGLang does not import: {exc}") from exc
        pytest.skip(
            f"SGLang is not installed ({exc}); this tier runs in the .[sglang] environment "
            "of .ci/run",
            allow_module_level=True,
        )
    os.environ.setdefault(TREE_CORE_ENV, TREE_CORE_BACKEND)  # only where the tier runs
    version = getattr(sglang, "__version__", None)
    if version != SGLANG_VERSION:
        message = f"SGLang {version} is installed; the plugin is written for {SGLANG_VERSION}"
        if required:
            raise RuntimeError(message)
        pytest.skip(message, allow_module_level=True)
