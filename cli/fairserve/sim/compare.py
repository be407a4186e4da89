"""Side-by-side runs: several policy/dispatch pairs on one workload, seed and profile.

The papers' claims are comparisons ("DLPM keeps ≥ 95 % of LPM's throughput", "DoubleQ beats
VTC + client round-robin"), so the simulator answers them directly: parse a list of pairs,
run each on identical traffic (a :class:`Bench` fixes everything but the pair), and reduce
every report to one row. This lives here, not in the command, so that ``bench`` and
``tune --sweep`` accept the same ``POLICY/DISPATCH,...`` syntax and build the same runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fairserve.core.errors import ConfigError
from fairserve.sched.dispatch.base import dispatcher_class
from fairserve.sched.local.base import local_policy_class
from fairserve.sched.params import Param
from fairserve.sched.registry import (
    dispatchers,
    local_policies,
    make_dispatcher,
    make_local_policy,
)
from fairserve.sim.cluster import Progress, SimConfig, simulate
from fairserve.sim.engine import DEFAULT_BATCHING
from fairserve.sim.profile import Profile
from fairserve.sim.recorder import SimResult
from fairserve.sim.report import build_report
from fairserve.sim.running_bound import default_running_requests
from fairserve.workloads.model import Workload

PAIR_SYNTAX = "POLICY or POLICY/DISPATCH, separated by commas"
_PLURAL = {"policy": "policies", "dispatcher": "dispatchers"}


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run of a comparison: a local policy behind a dispatcher."""

    policy: str
    dispatch: str

    @property
    def label(self) -> str:
        return f"{self.policy}/{self.dispatch}"

    @property
    def has_quantum(self) -> bool:
        """Whether the local policy takes a per-client quantum ``Q^u``."""
        return _declared(local_policy_class(self.policy).params, "quantum") is not None

    @property
    def has_worker_quantum(self) -> bool:
        """Whether the dispatcher takes a per-worker quantum ``Q^w``."""
        return _declared(dispatcher_class(self.dispatch).params, "worker_quantum") is not None


def parse_runs(text: str, default_dispatch: str) -> list[RunSpec]:
    """``"lpm/round-robin,vtc/client-rr,dlpm"`` → run specs (a bare policy gets
    ``default_dispatch``).

    Messages name the offending item by position and text, because a typo in the fifth of
    six pairs is otherwise hard to spot; names are checked here so that no run starts
    before every pair is known to be valid.
    """
    known_policies, known_dispatchers = local_policies(), dispatchers()
    runs: list[RunSpec] = []
    for index, raw in enumerate(text.split(","), start=1):
        item = raw.strip()
        where = f"item {index} {item!r}"
        parts = [part.strip() for part in item.split("/")]
        if not item or len(parts) > 2 or not all(parts):
            raise ConfigError(f"{where}: expected {PAIR_SYNTAX}")
        policy = parts[0]
        dispatch = parts[1] if len(parts) == 2 else default_dispatch
        if policy not in known_policies:
            expected = ", ".join(known_policies)
            raise ConfigError(f"{where}: unknown policy {policy!r}; expected one of: {expected}")
        if dispatch not in known_dispatchers:
            expected = ", ".join(known_dispatchers)
            raise ConfigError(
                f"{where}: unknown dispatcher {dispatch!r}; expected one of: {expected}"
            )
        spec = RunSpec(policy, dispatch)
        if spec in runs:
            raise ConfigError(f"{where}: {spec.label} is listed twice")
        runs.append(spec)
    return runs


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """The headline numbers of one run's report (DESIGN §7 keys)."""

    label: str
    tokens_per_s: float
    service_per_s: float
    requests_per_s: float
    cache_hit_rate: float
    jain_index: float
    max_service_gap: float
    latency_p99_s: Mapping[str, float | None]
    """Per client; None where the client finished no request."""


def comparison_row(label: str, report: Mapping[str, Any]) -> ComparisonRow:
    """Reduce a ``build_report`` object to its comparison row."""
    throughput = report["throughput"]
    return ComparisonRow(
        label=label,
        tokens_per_s=float(throughput["tokens_per_s"]),
        service_per_s=float(throughput["service_per_s"]),
        requests_per_s=float(throughput["requests_per_s"]),
        cache_hit_rate=float(report["cache_hit_rate"]),
        jain_index=float(report["jain_index"]),
        max_service_gap=float(report["max_service_gap"]),
        latency_p99_s={name: c["latency_p99_s"] for name, c in report["clients"].items()},
    )


def best_indices(values: Sequence[float], rel_tol: float = 1e-9) -> set[int]:
    """Indices of the largest value; every run that ties with it (within ``rel_tol``).

    Runs often tie exactly (a saturated cluster has one throughput whatever the order), and
    marking only the first of equals would suggest a difference that is not there.
    """
    if not values:
        return set()
    top = max(values)
    return {i for i, v in enumerate(values) if math.isclose(v, top, rel_tol=rel_tol)}


@dataclass(frozen=True)
class Bench:
    """Everything runs of a comparison share: traffic, seed, engine model, cluster size."""

    workload: Workload
    profile: Profile
    batching: str = DEFAULT_BATCHING
    workers: int = 2
    duration_s: float | None = None
    seed: int | None = None
    """None: the workload's own seed."""
    drain: bool = False
    max_running_requests: int | None = None
    """None: the bound ``launch``'s workers take (:mod:`~fairserve.sim.running_bound`),
    so the prediction runs the batch the service runs."""

    @property
    def running_bound(self) -> int:
        return self.max_running_requests or default_running_requests(self.profile)

    @property
    def seed_used(self) -> int:
        return self.workload.seed if self.seed is None else self.seed

    @property
    def span_s(self) -> float:
        """Simulated seconds of arrivals (what progress counts towards)."""
        return self.duration_s or self.workload.duration_s

    def configs(
        self,
        specs: Sequence[RunSpec],
        quantum: float | None = None,
        worker_quantum: float | None = None,
    ) -> list[SimConfig]:
        """One simulation per run; a quantum goes to every run whose policy (dispatcher)
        takes one.

        A quantum that no run can use is an error rather than silently ignored: the user
        believes it shaped the result.
        """
        takes_q = [s.has_quantum for s in specs]
        takes_qw = [s.has_worker_quantum for s in specs]
        _check_used("quantum", quantum, takes_q, [s.policy for s in specs], "policy")
        names = [s.dispatch for s in specs]
        _check_used("worker_quantum", worker_quantum, takes_qw, names, "dispatcher")
        return [
            self.config(spec, quantum if q else None, worker_quantum if qw else None)
            for spec, q, qw in zip(specs, takes_q, takes_qw, strict=True)
        ]

    def config(
        self, spec: RunSpec, quantum: float | None = None, worker_quantum: float | None = None
    ) -> SimConfig:
        """The simulation of one run.

        The policy and dispatcher are built once here, so that a bad parameter of the third
        run fails before the first run spends any time.
        """
        q: dict[str, Any] = {} if quantum is None else {"quantum": quantum}
        qw: dict[str, Any] = {} if worker_quantum is None else {"worker_quantum": worker_quantum}
        make_local_policy(spec.policy, **q)
        make_dispatcher(spec.dispatch, ["w0"], **qw)
        return SimConfig(
            engine=self.profile.engine_config(
                self.batching, max_running_requests=self.running_bound
            ),
            time_model=self.profile.batch_time(),
            policy=spec.policy,
            dispatch=spec.dispatch,
            workers=self.workers,
            quantum=quantum,
            worker_quantum=worker_quantum,
            duration_s=self.duration_s,
            seed=self.seed_used,
            drain=self.drain,
        )

    def run(self, config: SimConfig, progress: Progress | None = None) -> SimResult:
        return simulate(self.workload, config, progress)

    def report(self, config: SimConfig, result: SimResult) -> dict[str, Any]:
        """DESIGN §7 report of one run, with what was simulated (``worker_count``: the
        report's own ``workers`` is the per-worker list)."""
        policy_params = local_policy_class(config.policy).params
        dispatch_params = dispatcher_class(config.dispatch).params
        meta = {
            "workload": self.workload.name,
            "policy": config.policy,
            "dispatch": config.dispatch,
            "worker_count": self.workers,
            "profile": self.profile.name,
            "batching": self.batching,
            "max_running_requests": self.running_bound,
            "seed": self.seed_used,
            "drain": self.drain,
            "quantum": _effective(policy_params, "quantum", config.quantum),
            "worker_quantum": _effective(dispatch_params, "worker_quantum", config.worker_quantum),
        }
        return build_report(result, meta)


def _check_used(
    param: str, value: float | None, taken: Sequence[bool], names: Sequence[str], kind: str
) -> None:
    if value is None or any(taken):
        return
    unique = list(dict.fromkeys(names))
    subject = (
        f"{kind} {unique[0]} has"
        if len(unique) == 1
        else f"{_PLURAL[kind]} {', '.join(unique)} have"
    )
    owners = ", ".join(_owners(param))
    raise ConfigError(
        f"{param}={value:g}: {subject} no quantum; {_PLURAL[kind]} with one: {owners}"
    )


def _owners(param: str) -> list[str]:
    """Registered policies (``quantum``) or dispatchers (``worker_quantum``) taking ``param``."""
    if param == "quantum":
        return [n for n in local_policies() if _declared(local_policy_class(n).params, param)]
    return [n for n in dispatchers() if _declared(dispatcher_class(n).params, param)]


def _declared(params: Sequence[Param], name: str) -> Param | None:
    return next((p for p in params if p.name == name), None)


def _effective(params: Sequence[Param], name: str, given: float | None) -> float | str | None:
    """The quantum a run used (given, else the declared default); None if it has none.

    Infinity is written ``"inf"``, as ``fairserve policies --json`` does: JSON has none.
    """
    declared = _declared(params, name)
    if declared is None:
        return None
    value = float(declared.default if given is None else given)
    return "inf" if math.isinf(value) else value
