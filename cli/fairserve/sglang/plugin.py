"""The ``fairserve`` plugin of SGLang's ``sglang.srt.plugins`` entry-point group.

SGLang calls :func:`register` in every process it starts (HTTP server, schedulers,
detokenizer) when ``SGLANG_PLUGINS`` lists ``fairserve``. Without ``FAIRSERVE_POLICY`` it
does nothing, so installing fairserve next to SGLang changes nothing by itself. With it, the
hooks of :data:`fairserve.sglang.targets.HOOKS` are registered with SGLang's
``HookRegistry``; SGLang applies them before its scheduler starts.

It also selects SGLang's Python radix tree core unless ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``
is set (see ``targets.TREE_CORE_ENV``): only that one shows the plugin which prefixes it
evicts. Plugins load at the start of every scheduler process, before its cache exists.

A bad configuration stops the process (``SystemExit``) instead of being logged: SGLang logs
and swallows plugin exceptions, and a worker running without the fairness it was started
for, silently, is the worst outcome.
"""

from __future__ import annotations

import logging
import os

from fairserve.core.errors import ConfigError
from fairserve.sglang import hooks
from fairserve.sglang.config import ENV_POLICY, config_from_env
from fairserve.sglang.targets import HOOKS, TREE_CORE_BACKEND, TREE_CORE_ENV

log = logging.getLogger("fairserve.sglang")


def register() -> None:
    """Entry point: read the configuration, then register one hook per target."""
    try:
        config = config_from_env(os.environ)
    except ConfigError as exc:
        raise SystemExit(f"fairserve plugin: {exc}") from None
    if config is None:
        log.info("fairserve plugin: %s is not set; SGLang schedules on its own", ENV_POLICY)
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    backend = os.environ.setdefault(TREE_CORE_ENV, TREE_CORE_BACKEND)
    if backend != TREE_CORE_BACKEND:
        log.warning(
            "fairserve plugin: %s=%s: evicted prefixes are not reported to the router "
            "(needs %s)", TREE_CORE_ENV, backend, TREE_CORE_BACKEND,
        )  # fmt: skip
    hooks.activate(config)
    for target in HOOKS:
        HookRegistry.register(
            target.dotted, getattr(hooks, target.handler), HookType[target.kind.upper()]
        )
    log.info("fairserve plugin: policy %s, %d hooks registered", config.policy, len(HOOKS))
