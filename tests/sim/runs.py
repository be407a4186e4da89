"""Simulations as the report and paper tests set them up, in one place: a profile's engine
and step times, a policy and dispatcher, one workload, its report."""

from __future__ import annotations

from typing import Any

from fairserve.core.defaults import DEFAULT_BATCHING
from fairserve.sim.cluster import SimConfig, simulate
from fairserve.sim.profile import Profile
from fairserve.sim.report import build_report
from fairserve.workloads import resolve_workload


def profile_config(
    profile: Profile,
    *,
    batching: str = DEFAULT_BATCHING,
    kv_capacity_tokens: int | None = None,
    **config: Any,
) -> SimConfig:
    """A simulation on ``profile``'s engine (its KV pool unless ``kv_capacity_tokens``, its
    token budget and running bound) and step times; ``config``: the rest of the
    :class:`SimConfig` (policy, dispatch, workers, duration...)."""
    engine = profile.engine_config(batching, kv_capacity_tokens)
    return SimConfig(engine=engine, time_model=profile.batch_time(), **config)


def report_of(workload: str, config: SimConfig) -> dict[str, Any]:
    """The report of ``workload`` (a built-in name or a file) simulated under ``config``."""
    return build_report(simulate(resolve_workload(workload), config))
