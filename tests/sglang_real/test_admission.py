"""Inside SGLang's real admission loop, the plugin admits exactly what the core policy fed the
same events admits, in the same order, and keeps the same counters, retractions included.

The events are what SGLang's objects did: arrivals, each decision's prefix matches (from
``SchedulePolicy.calc_priority``), whether ``PrefillAdder.add_one_req`` took a request the
policy asked about (the KV budget is SGLang's), the real extend of each admission, the tokens
each forward produced, finishes and retractions (``ScheduleBatch.retract_decode``). The
reference policy gets them directly; the plugin gets them through its hooks."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.sglang_real.real import require_sglang

require_sglang()

from fairserve.core.types import Request, tokens_to_key  # noqa: E402
from fairserve.sched.local.base import LocalPolicy  # noqa: E402
from fairserve.sglang.config import PluginConfig, build_policy  # noqa: E402
from tests.sglang_real.harness import Engine, Step, set_policy  # noqa: E402

CASES: list[tuple[str, float | None, dict[str, Any]]] = [
    ("dlpm", 120.0, {}),
    ("vtc", None, {}),
    ("lcf", None, {}),
    ("justitia", None, {}),
]
KV_TOKENS = 900
STEPS = 400


@dataclass(frozen=True)
class Job:
    rid: str
    client: str
    tokens: tuple[int, ...]
    max_new: int
    step: int


def workload(seed: int, arrival_steps: int) -> list[Job]:
    """A flooding client ``a`` with a long shared prefix, two lighter ones; outputs long
    enough that the running batch outgrows the pool and SGLang retracts."""
    rng = random.Random(seed)
    jobs: list[Job] = []
    plan = {"a": (1, 3, 80), "b": (0, 1, 30), "c": (0, 1, 0)}
    for step in range(arrival_steps):
        for client, (low, high, prefix) in plan.items():
            for _ in range(rng.randint(low, high)):
                n = len(jobs)
                shared = [ord(client) * 1000 + i for i in range(prefix)]
                own = [100_000 + n * 100 + i for i in range(rng.randint(10, 60))]
                jobs.append(Job(f"r{n}", client, (*shared, *own), rng.randint(8, 80), step))
    return jobs


def run_plugin(engine: Engine, jobs: list[Job], steps: int) -> list[Step]:
    record = []
    for step in range(steps):
        for job in (j for j in jobs if j.step == step):
            engine.add(job.rid, job.tokens, job.max_new, job.client)
        record.append(engine.step())
    return record


@dataclass
class Reference:
    """The core policy fed the recorded events, the way ``PolicyHost`` turns them into
    policy calls (clock: batch results processed)."""

    policy: LocalPolicy
    jobs: dict[str, Job]
    clock: float = 0.0
    waiting: list[Request] = field(default_factory=list)
    running: dict[str, Request] = field(default_factory=dict)
    by_id: dict[str, Request] = field(default_factory=dict)

    def arrive(self, job: Job) -> None:
        req = Request(job.rid, job.client, tokens_to_key(job.tokens), job.max_new, self.clock)
        self.policy.on_arrival(req, self.clock)
        self.waiting.append(req)
        self.by_id[job.rid] = req

    def decide(self, step: Step) -> list[str]:
        prefill = step.prefill
        if prefill is None:
            return []
        candidates = [r for r in self.waiting if r.id in prefill.matched]
        if not candidates:
            return []
        took = {o.rid: o for o in prefill.offers if o.admitted}
        asked: list[str] = []

        def can_fit(req: Request) -> bool:
            asked.append(req.id)
            return req.id in took

        admitted = self.policy.select(
            candidates, can_fit, lambda r: prefill.matched[r.id], self.clock
        )
        evaluated = [o.rid for o in prefill.offers]
        if prefill.offers and not prefill.offers[-1].admitted:
            evaluated.pop()  # the loop's last offer may be the plugin's "stop" (OTHER)
        # In the policy's order; the plugin does not offer requests it knows SGLang would
        # refuse (the reference hears NO_FIT for them too: they are not in ``took``).
        order = iter(asked)
        assert all(rid in order for rid in evaluated), (step.step, asked, evaluated)
        for req in admitted:
            extend = took[req.id].extend
            req.cached_tokens = max(0, req.input_tokens - extend)
            if extend != max(0, req.input_tokens - prefill.matched[req.id]):
                self.policy.correct_extend(req, extend)
            self.running[req.id] = req
        self.waiting = [r for r in self.waiting if r.id not in self.running]
        return [r.id for r in admitted]

    def retract(self, step: Step) -> None:
        for rid in step.retracted:
            req = self.running.pop(rid)
            self.policy.on_retract(req, self.clock)
            self.waiting.insert(0, req)  # the host's order: back at the front, as the simulator

    def forward(self, step: Step) -> None:
        if step.results is None:
            return
        self.clock += 1
        produced: dict[int, list[Request]] = {}
        ended: list[Request] = []
        for rid, count, finished in step.results:
            req = self.running.get(rid)
            if req is None:
                continue
            if count > req.output_tokens:
                produced.setdefault(count - req.output_tokens, []).append(req)
            req.output_tokens = count
            if finished:
                ended.append(req)
        for steps, group in sorted(produced.items()):
            if steps == 1:
                self.policy.on_decode_step(group, self.clock)
            else:
                self.policy.on_decode_steps(group, steps, self.clock)
        for req in ended:
            self.policy.on_finish(req, self.clock)
            del self.running[req.id]


def replay(case: tuple[str, float | None, dict[str, Any]], jobs: list[Job], record: list[Step]
           ) -> tuple[list[list[str]], Reference]:  # fmt: skip
    name, quantum, params = case
    config = PluginConfig(policy=name, quantum=quantum, params=dict(params))
    reference = Reference(build_policy(config, KV_TOKENS), {j.rid: j for j in jobs})
    decisions = []
    for step in record:
        for job in (j for j in jobs if j.step == step.step):
            reference.arrive(job)
        decisions.append(reference.decide(step))
        reference.retract(step)
        reference.forward(step)
    return decisions, reference


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_same_admissions_and_counters_as_the_core_policy(
    case: tuple[str, float | None, dict[str, Any]],
) -> None:
    name, quantum, params = case
    set_policy(name, quantum, **params)
    engine = Engine(kv_tokens=KV_TOKENS, new_token_ratio=0.05)
    jobs = workload(seed=3, arrival_steps=20)
    record = run_plugin(engine, jobs, STEPS)
    host = engine.host
    assert host is not None
    assert engine.idle(), "every request must finish within the run"
    plugin = [s.prefill.admitted if s.prefill else [] for s in record]
    assert max(len(s.prefill.matched) for s in record if s.prefill) >= 10  # contended
    retracted = sum(len(s.retracted) for s in record)
    assert retracted > 0, "the scenario must make SGLang retract"

    reference, ref = replay(case, jobs, record)
    assert plugin == reference
    assert host.policy.snapshot() == ref.policy.snapshot()
    engine_counters = host.state_json()["engine"]
    assert engine_counters["retracted"] == retracted
    assert engine_counters["finished"] == len(jobs)
    assert engine_counters["admitted"] == len(jobs) + retracted  # re-admitted once each time
