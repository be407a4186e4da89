"""The plugin stops asking SGLang about requests it knows SGLang must refuse, and decides
exactly as when it offered every one.

After ``PrefillAdder.add_one_req`` refuses a request for lack of KV (``NO_TOKEN``), the host
compares each waiting request's least need (one extend token plus its output reservation)
with the memory left: it ends the decision (``EXHAUSTED``) when none fits, and does not offer
the ones that cannot (``admission.AdmissionBound``). Here the same random workloads run through
SGLang's real scheduling objects twice, with every request offered (``host.bound = None``,
the plugin before) and with the bound, under KV pools, prefill budgets and running-request
bounds that make SGLang answer ``NO_TOKEN`` and ``OTHER``: admissions, retractions, outputs,
the batch-full flag and the policy's state are the same at every step, with fewer offers."""

from __future__ import annotations

import copy
import copyreg
import importlib
import random
import threading
import types
from dataclasses import dataclass
from typing import Any

import pytest

from tests.sglang_real.real import require_sglang

require_sglang()

from sglang.srt.managers.schedule_policy import AddReqResult  # noqa: E402

from fairserve.sglang import hooks  # noqa: E402
from fairserve.sglang.host import PolicyHost  # noqa: E402
from tests.sglang_real.harness import Engine, Step, _Quiet, set_policy  # noqa: E402

# Deep copies of SGLang's objects and the host: modules are shared, locks made anew.
copyreg.pickle(types.ModuleType, lambda m: (importlib.import_module, (m.__name__,)))
copyreg.pickle(type(threading.RLock()), lambda lock: (threading.RLock, ()))
copyreg.pickle(type(threading.Lock()), lambda lock: (threading.Lock, ()))

POLICIES: list[tuple[str, float | None]] = [
    ("dlpm", 64.0),
    ("vtc", None),
    ("lcf", None),
    ("fcfs", None),
]
SEEDS = (1, 2, 3, 4, 5, 6)
STEPS = 100


@dataclass(frozen=True)
class Scenario:
    kv_tokens: int
    max_running: int
    max_prefill_tokens: int
    new_token_ratio: float
    jobs: tuple[tuple[int, str, tuple[int, ...], int], ...]
    """(arrival step, client, prompt tokens, max new tokens)."""


def scenario(seed: int) -> Scenario:
    """Clients with shared prefixes arriving in bursts; outputs up to ~the pool's size so
    that the KV pool fills (``NO_TOKEN`` with memory left) and some steps hit the prefill
    token budget or the running-request bound (``OTHER``)."""
    rng = random.Random(seed)
    kv = rng.choice((600, 900, 1500))
    jobs: list[tuple[int, str, tuple[int, ...], int]] = []
    for step in range(40):
        for client in "abcd":
            for _ in range(rng.choice((0, 0, 1, 1, 2, 4))):
                n = len(jobs)
                prefix = [ord(client) * 1000 + i for i in range(rng.choice((0, 20, 60)))]
                own = [100_000 + n * 200 + i for i in range(rng.randint(1, 90))]
                max_new = rng.choice((1, 4, 16, 40, 120, kv // 3))
                jobs.append((step, client, (*prefix, *own), max_new))
    return Scenario(
        kv_tokens=kv,
        max_running=rng.choice((6, 16, 64)),
        max_prefill_tokens=rng.choice((128, 512, 8192)),
        new_token_ratio=rng.choice((0.05, 0.4, 1.0)),
        jobs=tuple(jobs),
    )


def _twin(engine: Engine, host: PolicyHost) -> tuple[Engine, PolicyHost]:
    """A deep copy of the engine (SGLang's pools, tree, requests, batches) and its host; the
    scheduler's quiet stand-ins are shared (their ``__getattr__`` answers every name)."""
    memo = {id(v): v for v in vars(engine.scheduler).values() if isinstance(v, _Quiet)}
    twin: tuple[Engine, PolicyHost] = copy.deepcopy((engine, host), memo)
    return twin


def _install(engine: Engine, host: PolicyHost) -> None:
    hooks.install_host(host)
    hooks.PLUGIN.scheduler = engine.scheduler


def _admitted(step: Step) -> list[str] | None:
    return step.prefill.admitted if step.prefill else None


@pytest.mark.parametrize(
    ("policy", "seed", "spared"),
    [(POLICIES[0], 1, True), (POLICIES[0], 2, True), (POLICIES[0], 3, True),
     (POLICIES[1], 4, False), (POLICIES[2], 5, False), (POLICIES[3], 6, False)],
    ids=["dlpm-1", "dlpm-2", "dlpm-3", "vtc-4", "lcf-5", "fcfs-6"],
)  # fmt: skip
def test_each_decision_is_the_one_of_offering_every_request(
    policy: tuple[str, float | None], seed: int, spared: bool
) -> None:
    """At every step a twin of the engine (deep copy) decides with every request offered;
    the engine, with the bound, must admit the same, leave the same policy state and
    batch-full flag. Step by step, not two whole runs: SGLang's matching of a request it
    then refuses touches its prefix's LRU time in the radix tree, so the runs' caches evict
    differently later (the bound keeps SGLang's LRU as its own loop leaves it, which stops
    at the first refusal). ``spared``: the scenario must make SGLang refuse requests with
    memory left and the bound spare it some offers."""
    case = scenario(seed)
    set_policy(*policy)
    engine = Engine(
        kv_tokens=case.kv_tokens, max_running=case.max_running,
        max_prefill_tokens=case.max_prefill_tokens, new_token_ratio=case.new_token_ratio,
    )  # fmt: skip
    host = engine.host
    assert host is not None and host.bound is not None, "SGLang's rule must be recognised"
    offers = {"every": 0, "bounded": 0}
    refused = 0
    try:
        for step in range(STEPS):
            for i, (at, client, tokens, max_new) in enumerate(case.jobs):
                if at == step:
                    engine.add(f"r{i}", tokens, max_new, client)
            twin, twin_host = _twin(engine, host)
            twin_host.bound = None
            _install(twin, twin_host)
            expected = twin.step()
            _install(engine, host)
            got = engine.step()
            assert _admitted(got) == _admitted(expected), step
            assert got.retracted == expected.retracted, step
            assert got.results == expected.results, step
            assert host.policy.snapshot() == twin_host.policy.snapshot(), step
            assert engine.running.batch_is_full == twin.running.batch_is_full, step
            if expected.prefill is not None and got.prefill is not None:
                offers["every"] += len(expected.prefill.offers)
                offers["bounded"] += len(got.prefill.offers)
                refused += sum(
                    not o.admitted and o.result == AddReqResult.CONTINUE
                    for o in expected.prefill.offers
                )
    finally:
        hooks.install_host(None)
        hooks.PLUGIN.scheduler = None
    assert offers["bounded"] <= offers["every"], offers
    if spared:  # DLPM's fill asks about every waiting request: the bound must bite
        assert refused > 0, "the KV pool must fill with memory left (SGLang's NO_TOKEN)"
        assert offers["bounded"] < offers["every"], offers


def test_the_scenarios_reach_both_of_sglangs_stops() -> None:
    """Without the plugin, SGLang's own loop over these scenarios stops on ``NO_TOKEN`` (the
    KV pool) and on ``OTHER`` (the prefill token budget)."""
    seen: set[Any] = set()
    for seed in SEEDS:
        case = scenario(seed)
        set_policy(None)
        engine = Engine(
            kv_tokens=case.kv_tokens, max_running=case.max_running,
            max_prefill_tokens=case.max_prefill_tokens, new_token_ratio=case.new_token_ratio,
        )  # fmt: skip
        assert engine.host is None
        for step in range(STEPS):
            for i, (at, client, tokens, max_new) in enumerate(case.jobs):
                if at == step:
                    engine.add(f"r{i}", tokens, max_new, client)
            record = engine.step().prefill
            seen |= {o.result for o in record.offers} if record else set()
    assert {AddReqResult.NO_TOKEN, AddReqResult.OTHER} <= seen
