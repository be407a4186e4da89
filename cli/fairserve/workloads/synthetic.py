"""Synthetic workloads: a parsed workload file as a lazy, seeded stream of programs."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping
from pathlib import Path

from fairserve.core.errors import ConfigError
from fairserve.workloads.arrivals import arrival_times
from fairserve.workloads.model import ClientInfo, Program
from fairserve.workloads.parse import load_spec, loads_spec, parse_spec
from fairserve.workloads.programs import ProgramBuilder
from fairserve.workloads.spec import WorkloadSpec
from fairserve.workloads.tokens import ARRIVALS, NAMED_PREFIX, PREFIX, PrefixSource, stream_rng


class SyntheticWorkload:
    """Implements the ``Workload`` protocol for a workload file.

    Each client stream draws from its own random streams, seeded by the workload seed and
    the client's name (and the entry's index among entries of that name), so adding or
    reordering clients leaves every other client's traffic identical.
    """

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        weights: dict[str, float] = {}
        for client in spec.clients:
            weights.setdefault(client.name, client.weight)
        self._clients = tuple(ClientInfo(name, weight) for name, weight in weights.items())

    def __repr__(self) -> str:
        return f"SyntheticWorkload({self.name!r}, {len(self._clients)} clients)"

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def description(self) -> str:
        return self.spec.description

    @property
    def duration_s(self) -> float:
        return self.spec.duration_s

    @property
    def seed(self) -> int:
        return self.spec.seed

    @property
    def clients(self) -> tuple[ClientInfo, ...]:
        return self._clients

    def programs(
        self, seed: int | None = None, duration_s: float | None = None
    ) -> Iterator[Program]:
        """Programs of all clients in start order (ties: file order), lazily."""
        seed = self.seed if seed is None else _check_seed(seed)
        horizon_s = self.duration_s if duration_s is None else _check_duration(duration_s)
        prefixes = {
            c.name: PrefixSource(stream_rng(seed, c.name, PREFIX, 0)) for c in self._clients
        }
        named = {
            p.name: PrefixSource(stream_rng(seed, p.name, NAMED_PREFIX, 0)).prefix(p.tokens)
            for p in self.spec.prefixes
        }
        builders: list[ProgramBuilder] = []
        streams: list[Iterator[tuple[float, int]]] = []
        for index, spec in enumerate(self.spec.clients):
            common = named[spec.shared_prefix] if spec.shared_prefix is not None else b""
            builders.append(ProgramBuilder(spec, seed, prefixes[spec.name], common))
            stop_s = horizon_s if spec.stop_s is None else min(spec.stop_s, horizon_s)
            rng = stream_rng(seed, spec.name, ARRIVALS, spec.occurrence)
            streams.append(_tagged(arrival_times(spec.arrival, rng, spec.start_s, stop_s), index))
        return _build_merged(builders, streams)


def _build_merged(
    builders: list[ProgramBuilder], streams: list[Iterator[tuple[float, int]]]
) -> Iterator[Program]:
    """Build each program only when the merge reaches it: one client's programs are
    numbered in start order across all of its entries."""
    counters: dict[str, int] = {}
    for start_s, index in heapq.merge(*streams):
        builder = builders[index]
        client = builder.spec.name
        number = counters.get(client, 0)
        counters[client] = number + 1
        yield builder.build(f"{client}/p{number}", start_s)


def _tagged(times: Iterator[float], index: int) -> Iterator[tuple[float, int]]:
    for t in times:
        yield t, index


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed: expected an integer >= 0, got {seed!r}")
    return seed


def _check_duration(duration_s: float) -> float:
    if not math.isfinite(duration_s) or duration_s <= 0:
        raise ConfigError(f"duration_s: expected a positive number, got {duration_s!r}")
    return float(duration_s)


def load_workload(path: str | Path) -> SyntheticWorkload:
    """Read and validate a workload file (errors: ``ConfigError`` naming file and field)."""
    return SyntheticWorkload(load_spec(path))


def loads_workload(text: str, source: str = "<string>") -> SyntheticWorkload:
    """Parse workload TOML text; ``source`` names it in error messages."""
    return SyntheticWorkload(loads_spec(text, source))


def parse_workload(data: Mapping[str, object], source: str = "<dict>") -> SyntheticWorkload:
    """Validate a decoded workload (a TOML document as a dict)."""
    return SyntheticWorkload(parse_spec(data, source))
