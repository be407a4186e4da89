"""Every test here gets a fresh plugin state: no host or configuration leaks between tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fairserve.sglang import hooks
from fairserve.sglang.config import PluginConfig, build_policy
from fairserve.sglang.host import PolicyHost
from tests.fakes.sglang import AddReqResult, apply_hooks_locally

MakeHost = Callable[..., PolicyHost]


def make_host(policy: str, quantum: float | None = None, **params: Any) -> PolicyHost:
    """A host like the scheduler hook builds it, with the fake ``AddReqResult``."""
    config = PluginConfig(policy=policy, quantum=quantum, params=params)
    return PolicyHost(config, build_policy(config), AddReqResult)


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeHost]:
    """Hook the fake SGLang classes (undone after the test); build a host and make it the
    process's plugin host (as ``scheduler_ready`` does)."""
    apply_hooks_locally(monkeypatch.setattr)

    def make(policy: str, quantum: float | None = None, **params: Any) -> PolicyHost:
        host = make_host(policy, quantum, **params)
        hooks.install_host(host)
        return host

    yield make
    hooks.install_host(None)
    hooks.PLUGIN.config = None
    hooks.PLUGIN.scheduler = None
