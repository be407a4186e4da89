"""Hypothesis strategies and runners shared by the local-policy tests.

A *workload* is a list of ``(step, request)`` arrivals for 2-4 clients. Some clients are
*heavy*: they submit a burst that keeps them backlogged for most of the run; the others
arrive now and then. Prompts are built from a few shared prefixes per client so that the
prefix cache and LPM order matter.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy
from tests.fakes.engine import StepEngine, by_step
from tests.fakes.factories import prefix_request

CAPACITY_TOKENS = 1200
"""Engine memory M in the property tests: a few requests at a time, so queues build up."""

UNIFORM_NEED_TOKENS = 240
"""Memory per request in the no-fragmentation workloads (5 requests fill the engine)."""


@dataclass(frozen=True)
class ClientSpec:
    """How one generated client behaves."""

    heavy: bool
    prefixes: int
    prefix_tokens: int
    suffix_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    requests: int
    spread_steps: int


@st.composite
def client_specs(draw: st.DrawFn, heavy: bool) -> ClientSpec:
    low_suffix = draw(st.integers(1, 80))
    low_out = draw(st.integers(1, 20))
    return ClientSpec(
        heavy=heavy,
        prefixes=draw(st.integers(1, 3)),
        prefix_tokens=draw(st.sampled_from([0, 16, 64, 200])),
        suffix_tokens=(low_suffix, low_suffix + draw(st.integers(0, 120))),
        output_tokens=(low_out, low_out + draw(st.integers(0, 40))),
        requests=draw(st.integers(25, 50) if heavy else st.integers(2, 12)),
        spread_steps=draw(st.integers(0, 10) if heavy else st.integers(10, 120)),
    )


@st.composite
def workloads(draw: st.DrawFn, need_tokens: int | None = None) -> list[tuple[int, Request]]:
    """Arrivals of 2-4 clients, at least one heavy; deterministic token ids.

    With ``need_tokens`` every request holds exactly that much memory (input + output):
    prompts, prefixes and output lengths still vary, but a request that does not fit means
    that none fits — the no-fragmentation setting of the fairness bounds' proofs."""
    count = draw(st.integers(2, 4))
    heavy = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    heavy[0] = True
    arrivals: list[tuple[int, Request]] = []
    for c, is_heavy in enumerate(heavy):
        spec = draw(client_specs(is_heavy))
        for i in range(spec.requests):
            step = draw(st.integers(0, spec.spread_steps))
            prefix = draw(st.integers(0, spec.prefixes - 1))
            suffix = draw(st.integers(*spec.suffix_tokens))
            output = draw(st.integers(*spec.output_tokens))
            if need_tokens is not None:
                suffix = min(suffix, need_tokens - 1 - spec.prefix_tokens)
                output = need_tokens - spec.prefix_tokens - suffix
            rid = f"c{c}-{i}"
            req = prefix_request(rid, f"c{c}", f"c{c}/{prefix}", spec.prefix_tokens, suffix, output)
            arrivals.append((step, req))
    return arrivals


def run_workload(
    policy: LocalPolicy,
    arrivals: list[tuple[int, Request]],
    capacity_tokens: int = CAPACITY_TOKENS,
    max_steps: int = 20_000,
) -> StepEngine:
    """Drive ``policy`` over ``arrivals`` until everything finished (or ``max_steps``)."""
    engine = StepEngine(policy, capacity_tokens=capacity_tokens)
    engine.run(by_step(arrivals), max_steps)
    return engine


def max_input_tokens(arrivals: list[tuple[int, Request]]) -> int:
    """``L_input``: the longest prompt of the workload."""
    return max(req.input_tokens for _, req in arrivals)
