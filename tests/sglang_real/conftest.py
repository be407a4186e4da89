"""The tier's session: SGLang loads the installed plugin through its own ``load_plugins()``
(entry point group ``sglang.srt.plugins``, ``SGLANG_PLUGINS=fairserve``), which registers
the hooks and has SGLang's ``HookRegistry`` patch SGLang's classes, once per process, as in
every process of a real server. Each test then configures the policy it runs.

Nothing here imports SGLang at import time: without it, every test module of the tier skips
itself (``real.require_sglang``) and these fixtures never run."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from fairserve.sglang import targets


@pytest.fixture(scope="session", autouse=True)
def plugin_loaded() -> Iterator[None]:
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    from tests.sglang_real.harness import environment_for_plugin

    env = environment_for_plugin("dlpm")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        load_plugins()
        missing = {t.dotted for t in targets.HOOKS} - HookRegistry._patched
        assert not missing, f"SGLang did not apply the plugin's hooks: {sorted(missing)}"
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(autouse=True)
def fresh_plugin() -> Iterator[None]:
    from tests.sglang_real.harness import reset_plugin

    reset_plugin()
    yield
    reset_plugin()
