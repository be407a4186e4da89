"""The plugin's settings, carried by environment variables from the launcher to SGLang.

SGLang starts the plugin in processes fairserve does not create (the scheduler of every
tensor-parallel rank is a child of SGLang's launcher), so the environment is the one
channel that reaches all of them. :func:`plugin_env` writes it (``fairserve launch``),
:func:`config_from_env` reads it (the plugin), so both sides agree on names and formats.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fairserve.core.errors import ConfigError
from fairserve.sched.local.base import LocalPolicy, local_policy_class
from fairserve.sched.registry import load_all, local_policies, make_local_policy
from fairserve.sglang.targets import PLUGIN_NAME, TREE_CORE_BACKEND, TREE_CORE_ENV

ENV_POLICY = "FAIRSERVE_POLICY"
ENV_QUANTUM = "FAIRSERVE_QUANTUM"
ENV_PARAMS = "FAIRSERVE_POLICY_PARAMS"
ENV_EXTENSION_HOST = "FAIRSERVE_EXTENSION_HOST"
ENV_EXTENSION_PORT = "FAIRSERVE_EXTENSION_PORT"
ENV_ADMIN_TOKEN = "FAIRSERVE_ADMIN_TOKEN"
ENV_SGLANG_PLUGINS = "SGLANG_PLUGINS"

DEFAULT_EXTENSION_HOST = "127.0.0.1"

UNSUPPORTED = {
    "rpm": "it rejects requests with HTTP 429, which only the router can answer; "
    "run rpm in the router (fairserve router --policy rpm)",
}
"""Local policies that cannot run inside SGLang's scheduler, and why."""


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """What the plugin runs: a local policy and where its extension listens."""

    policy: str
    quantum: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    extension_host: str = DEFAULT_EXTENSION_HOST
    extension_port: int | None = None
    """None: no extension server (the policy still runs)."""
    admin_token: str | None = None


def plugin_policies() -> list[str]:
    """The registry's local policies that can run inside SGLang."""
    return [name for name in local_policies() if name not in UNSUPPORTED]


def config_from_env(env: Mapping[str, str]) -> PluginConfig | None:
    """The configuration, or None when ``FAIRSERVE_POLICY`` is unset (plugin inactive).

    Bad values raise ConfigError naming the variable: a worker that silently ran without
    the fairness it was started for would be worse than one that does not start."""
    name = env.get(ENV_POLICY, "").strip()
    if not name:
        return None
    config = PluginConfig(
        policy=name,
        quantum=_quantum(env.get(ENV_QUANTUM)),
        params=_params(env.get(ENV_PARAMS)),
        extension_host=env.get(ENV_EXTENSION_HOST, "").strip() or DEFAULT_EXTENSION_HOST,
        extension_port=_port(env.get(ENV_EXTENSION_PORT)),
        admin_token=env.get(ENV_ADMIN_TOKEN) or None,
    )
    build_policy(config)  # unknown names, bad quanta and parameters fail here
    return config


def build_policy(config: PluginConfig, kv_capacity_tokens: int | None = None) -> LocalPolicy:
    """The local policy with the quantum and, where it takes one, the engine's KV capacity."""
    load_all()
    if config.policy in UNSUPPORTED:
        raise ConfigError(
            f"{ENV_POLICY}: policy {config.policy} cannot run inside SGLang: "
            f"{UNSUPPORTED[config.policy]}"
        )
    if config.policy not in local_policies():
        raise ConfigError(
            f"{ENV_POLICY}: unknown local policy {config.policy!r}; expected one of: "
            f"{', '.join(plugin_policies())}"
        )
    params = dict(config.params)
    declared = {p.name for p in local_policy_class(config.policy).params}
    if config.quantum is not None:
        if "quantum" not in declared:
            raise ConfigError(f"{ENV_QUANTUM}: policy {config.policy} has no quantum")
        params["quantum"] = config.quantum
    if kv_capacity_tokens and "kv_capacity_tokens" in declared:
        params.setdefault("kv_capacity_tokens", kv_capacity_tokens)
    return make_local_policy(config.policy, **params)


def plugin_env(config: PluginConfig) -> dict[str, str]:
    """The environment that makes an SGLang server run ``config`` (the launcher's side).

    The admin token is left out: the launcher passes it separately, the same way it does
    to simulated workers, so it never shows up in ``--dry-run`` output."""
    env = {
        ENV_SGLANG_PLUGINS: PLUGIN_NAME,
        ENV_POLICY: config.policy,
        TREE_CORE_ENV: TREE_CORE_BACKEND,
    }
    if config.quantum is not None:
        env[ENV_QUANTUM] = f"{config.quantum:g}"
    if config.params:
        env[ENV_PARAMS] = json.dumps(config.params, sort_keys=True)
    if config.extension_port is not None:
        env[ENV_EXTENSION_HOST] = config.extension_host
        env[ENV_EXTENSION_PORT] = str(config.extension_port)
    return env


def _quantum(text: str | None) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{ENV_QUANTUM}: expected a positive number, got {text!r}") from None
    if not value > 0 or math.isnan(value):
        raise ConfigError(f"{ENV_QUANTUM}: expected a positive number, got {text!r}")
    return value


def _params(text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{ENV_PARAMS}: expected a JSON object, got {text!r} ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{ENV_PARAMS}: expected a JSON object, got {text!r}")
    return value


def _port(text: str | None) -> int | None:
    if text is None or not text.strip():
        return None
    if not text.strip().isdigit() or not 0 <= int(text) <= 65535:
        raise ConfigError(f"{ENV_EXTENSION_PORT}: expected a port 0..65535, got {text!r}")
    return int(text)
