"""The router's one owner of weights and quanta (``router.settings``)."""

from __future__ import annotations

import pytest

from fairserve.core.errors import ConfigError
from fairserve.router.config import RouterConfig
from fairserve.router.service import Router
from fairserve.router.settings import FairnessSettings


def settings() -> FairnessSettings:
    return FairnessSettings({"a": 2.0}, None, 8192.0, 512.0, 512.0)


def test_a_weight_change_is_versioned_and_reaches_every_listener_in_order() -> None:
    s = settings()
    heard: list[tuple[str, str, float]] = []
    s.on_weight(lambda c, w: heard.append(("first", c, w)))
    s.on_weight(lambda c, w: heard.append(("second", c, w)))
    assert s.set_weight("a", 3.0) == 2.0
    assert s.set_weight("b", 0.5) == 1.0
    assert heard == [("first", "a", 3.0), ("second", "a", 3.0), ("first", "b", 0.5),
                     ("second", "b", 0.5)]  # fmt: skip
    assert s.version == 2 and s.live_weights == {"a": 3.0, "b": 0.5}
    assert s.live().weights == {"a": 3.0, "b": 0.5}
    with pytest.raises(ConfigError):
        s.set_weight("a", -1.0)
    assert s.version == 2 and s.weight("a") == 3.0


def test_a_quantum_a_listener_refuses_changes_nothing() -> None:
    s = settings()

    def refuse(quantum: float) -> None:
        raise ConfigError("no")

    s.on_quantum(refuse)
    with pytest.raises(ConfigError):
        s.set_quantum(64.0)
    assert s.quantum is None and s.version == 0


def test_the_effective_quantum_says_where_it_comes_from() -> None:
    s = settings()
    assert s.effective_quantum(lambda url: True, queues=False) == (512.0, "default")
    assert s.effective_quantum(lambda url: True, queues=True) == (512.0, "router-queue")
    s.reported("http://w", 256.0)
    assert s.effective_quantum(lambda url: True, queues=True) == (256.0, "workers")
    assert s.effective_quantum(lambda url: False, queues=False) == (512.0, "default")
    s.set_quantum(128.0)
    assert s.effective_quantum(lambda url: True, queues=True) == (128.0, "set")
    assert FairnessSettings({}, None, None, None, None).effective_quantum(
        lambda url: True, queues=True
    ) == (None, None)


def test_the_router_applies_a_weight_in_the_dispatcher_and_the_ledger() -> None:
    router = Router(RouterConfig(worker_urls=("http://127.0.0.1:1",)))
    router.accounting.arrived("a", 1.0, 0.0)
    router.settings.set_weight("a", 4.0)
    assert router.dispatcher.weight("a") == 4.0
    assert router.accounting.clients["a"].weight == 4.0
    assert router.weights["a"] == router.live_weights["a"] == 4.0
