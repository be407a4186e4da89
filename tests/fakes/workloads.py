"""A small workload built from explicit client specs, for simulator tests.

It implements the ``workloads.model.Workload`` protocol directly (Poisson arrivals, fixed
lengths, a per-client shared prefix), so engine and cluster tests do not depend on the
workload file format.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from fairserve.core.types import tokens_to_key
from fairserve.workloads.model import Call, ClientInfo, Program


@dataclass(frozen=True)
class ClientSpec:
    name: str
    rate_per_s: float
    input_tokens: int
    output_tokens: int
    shared_prefix_tokens: int = 0
    weight: float = 1.0
    start_s: float = 0.0
    stop_s: float | None = None


@dataclass(frozen=True)
class SpecWorkload:
    specs: tuple[ClientSpec, ...]
    duration_s: float
    seed: int = 0
    name: str = "spec"
    description: str = "test workload"

    @property
    def clients(self) -> tuple[ClientInfo, ...]:
        return tuple(ClientInfo(s.name, s.weight) for s in self.specs)

    def programs(
        self, seed: int | None = None, duration_s: float | None = None
    ) -> Iterator[Program]:
        end_s = duration_s or self.duration_s
        base = self.seed if seed is None else seed
        streams = [self._client(i, s, base, end_s) for i, s in enumerate(self.specs)]
        merged = sorted((p for stream in streams for p in stream), key=lambda p: p.start_s)
        return iter(merged)

    def _client(self, index: int, spec: ClientSpec, seed: int, end_s: float) -> list[Program]:
        rng = np.random.default_rng([seed, index])
        prefix = rng.integers(0, 32000, spec.shared_prefix_tokens)
        out: list[Program] = []
        t, n = spec.start_s, 0
        stop = min(end_s, spec.stop_s or end_s)
        while True:
            t += float(rng.exponential(1.0 / spec.rate_per_s))
            if t >= stop:
                return out
            suffix = rng.integers(0, 32000, spec.input_tokens - spec.shared_prefix_tokens)
            key = tokens_to_key(np.concatenate([prefix, suffix]).tolist())
            call = Call(f"{spec.name}/p{n}/c0", key, spec.output_tokens, spec.output_tokens)
            out.append(Program(f"{spec.name}/p{n}", spec.name, "single", t, (call,)))
            n += 1
