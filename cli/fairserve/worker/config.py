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
    """``--max-running-requests`` (SGLang's option): None takes :func:`max_running_requests`
    of the profile."""

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
        running = self.max_running_requests or max_running_requests(self.profile)
        return self.profile.engine_config(self.batching, max_running_requests=running)


MIN_RUNNING_REQUESTS = 32
MAX_RUNNING_REQUESTS = 1024
STEP_TOKENS_PER_REQUEST = 5
"""Tokens a running request puts in each step of a mixed (chunked-prefill) batch, on
average: its decode token plus its prompt spread over its output steps, ``(P + O) / O``,
for prompts about four times the output (the soak's 126-token prompts and 32-token answers;
chat and RAG traffic runs 2 to 10)."""
FULL_STEP_FACTOR = 2.0
"""The latency target that sets the default running bound: under overload a full step
takes at most this many one-token steps, so every running request, a light tenant's
included, decodes at half its unloaded speed or better.

Measured with ``tests/perf/soak_router.py`` (2 workers, ``--speed 0.05``, 10 heavy and 40
light clients at 2x the measured capacity, 300 s after 120 s of light clients alone, one
bound after the other on a 2-core VM): bound 52 (a factor of 2) finished 0.64 of the
profile's peak with light clients' p99 1.61x their p99 alone, 92 (3) 0.78 and 1.78x, 132
and 172 0.78 and 0.82 (1.89x and 1.59x) with light p99s of 54 and 64 s against 40 s at 92. Past
3 the throughput barely grows while every request's latency does, alone and under load.
Why 2 and not 3: a larger batch also widens the service a client gets ahead of another
before the fair policy can answer (the batch turns over only as requests finish): the
README's showcase (``vtc-constant``, two clients at 1:2, 10 s of arrivals) measured Jain's
index 0.965 and a 1.47 service ratio at 92, against 0.98-0.99 at 52."""


def max_running_requests(profile: Profile) -> int:
    """How many requests the worker runs at once: the profile's value, else the largest
    batch whose full step meets :data:`FULL_STEP_FACTOR`.

    SGLang bounds its running batch (``--max-running-requests``, the KV pool, the token
    budget), so under overload requests queue and the running ones keep finishing. An
    unbounded simulated worker instead admits everything the KV pool holds (hundreds of
    thousands of requests): every step then takes seconds and nothing finishes.

    A step over ``b`` tokens takes ``overhead + c + a·(b − b0)``, so it takes ``F`` one-token
    steps at ``b0 + (F − 1)·(c + overhead)/a`` tokens; divided by the tokens each running
    request brings to a step (:data:`STEP_TOKENS_PER_REQUEST`: with chunked prefill a step
    carries the running requests' decode tokens *and* the new prompts' chunks), that is the
    bound. 52 for ``a100-llama-3-8b``. Why not more: at ``b`` tokens a step a batch-time
    line gives the fraction ``b / (b − b0 + (c + overhead)/a)`` of its peak throughput
    (``1/a`` tokens/s), so 90% of the peak needs ``b ≈ 9·((c + overhead)/a − b0)``, steps
    of about seven one-token steps for ``a100-llama-3-8b``, and light tenants' requests,
    which share every step, would take several times their latency alone. The target
    trades that off (figures at :data:`FULL_STEP_FACTOR`). Kept within [32, 1024]. The
    simulator (``fairserve simulate``) keeps the profile's own value, so its records do
    not change.
    """
    if profile.max_running_requests is not None:
        return profile.max_running_requests
    step_s = profile.c_s + profile.step_overhead_s
    if profile.a_s_per_token <= 0:
        return MAX_RUNNING_REQUESTS
    target_tokens = profile.b0_tokens + (FULL_STEP_FACTOR - 1.0) * step_s / profile.a_s_per_token
    running = round(target_tokens / STEP_TOKENS_PER_REQUEST)
    return int(min(MAX_RUNNING_REQUESTS, max(MIN_RUNNING_REQUESTS, running)))


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
