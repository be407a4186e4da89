"""What one simulated worker runs: policy, profile, batching, speed, identity.

Built once from the command line (``fairserve worker``) or by a supervisor (``launch``),
and turned into a fresh :class:`~fairserve.sim.engine.Engine` by :func:`build_engine`, the
same construction the cluster simulation uses, so a worker behaves like a simulated one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fairserve.core.errors import ConfigError
from fairserve.sched.local.base import LocalPolicy, local_policy_class
from fairserve.sched.registry import load_all, make_local_policy
from fairserve.sim.engine import DEFAULT_BATCHING, Engine, EngineConfig
from fairserve.sim.profile import Profile
from fairserve.sim.running_bound import default_running_requests

DEFAULT_MODEL_NAME = "fairserve-sim"
DEFAULT_POLICY = "dlpm"


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a simulated worker needs besides its address."""

    profile: Profile
    policy: str = DEFAULT_POLICY
    quantum: float | None = None
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    batching: str = DEFAULT_BATCHING
    speed: float = 1.0
    """Simulated seconds per wall-clock second."""
    model_name: str = DEFAULT_MODEL_NAME
    admin_token: str | None = None
    max_lag_s: float = 0.05
    """Wall seconds the engine may fall behind the clock before simulated time slips
    (slows down) instead of the engine catching up with back-to-back steps."""
    max_running_requests: int | None = None
    """``--max-running-requests`` (SGLang's option): None takes the profile's default
    (:func:`~fairserve.sim.running_bound.default_running_requests`)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.speed) and self.speed > 0):
            raise ConfigError(f"--speed: expected a positive number, got {self.speed}")
        if not self.model_name.strip():
            raise ConfigError("--model-name: expected a non-empty name")
        if self.admin_token is not None and not self.admin_token.strip():
            raise ConfigError("--admin-token: expected a non-empty token")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise ConfigError(
                f"--max-running-requests: expected at least 1, got {self.max_running_requests}"
            )
        # Fail at startup, not on the first request: build one engine now.
        build_engine(self)

    @property
    def context_length(self) -> int:
        """Prompt plus output tokens one request may reach: the KV capacity (a simulated
        model has no shorter limit, and a request that cannot fit the KV never runs).
        Served as ``context_length`` and ``max_model_len``, as SGLang and vLLM do."""
        return self.profile.kv_capacity_tokens

    def engine_config(self) -> EngineConfig:
        running = self.max_running_requests or default_running_requests(self.profile)
        return self.profile.engine_config(self.batching, max_running_requests=running)


def build_policy(config: WorkerConfig) -> LocalPolicy:
    """The local policy by name, with ``--quantum`` and the KV capacity where it takes them."""
    load_all()
    params = dict(config.policy_params)
    declared = {p.name for p in local_policy_class(config.policy).params}
    if config.quantum is not None:
        if "quantum" not in declared:
            raise ConfigError(f"--quantum: policy {config.policy} has no quantum")
        params["quantum"] = config.quantum
    if "kv_capacity_tokens" in declared:
        params.setdefault("kv_capacity_tokens", config.profile.kv_capacity_tokens)
    return make_local_policy(config.policy, **params)


def build_engine(config: WorkerConfig) -> Engine:
    return Engine(build_policy(config), config.profile.batch_time(), config.engine_config())


def parse_params(assignments: Iterable[str], option: str = "--param") -> dict[str, Any]:
    """``key=value`` strings as a dict; values become booleans, integers, floats or stay text.

    The policy's declared parameters then check types and ranges (``sched.params``)."""
    params: dict[str, Any] = {}
    for item in assignments:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{option} {item!r}: expected key=value")
        params[key] = _value(text.strip())
    return params


def _value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
