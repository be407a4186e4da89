"""What the SGLang plugin costs per batching step, inside SGLang's real scheduling objects.

    .venv-sglang/bin/python tests/perf/bench_sglang_plugin.py [--json] [--steps 200]

Needs SGLang (the ``.[sglang]`` environment, as ``tests/sglang_real``); no GPU, no model.
The queue is kept at 10, 100 and 1,000 waiting requests (six clients with shared prefixes,
refilled every step) while the engine admits what its KV pool takes and decodes. For each
size it times SGLang's batching decision (``SchedulePolicy.calc_priority`` plus the admission
loop over ``PrefillAdder.add_one_req``) and the whole iteration, with the plugin disabled
(SGLang's own LPM ordering; SGLang switches LPM to FCFS above 128 waiting requests) and
with DLPM and VTC inside it. Medians, best and p99 over the steps that made a decision;
the note gives the policy's questions per decision, and a first row the cost of one answer
alone (a generator ``send`` into the policy's ``decide``, ``sglang/decision.py``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "cli"):  # runnable as a script from any directory
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from tests.perf.timing import Result, print_json, print_table, summarize  # noqa: E402

SIZES = (10, 100, 1000)
POLICIES: tuple[tuple[str | None, float | None], ...] = (
    (None, None),
    ("dlpm", 256.0),
    ("vtc", None),
)
CLIENTS = 6
PREFIX_TOKENS = 48
OWN_TOKENS = 16


def bench(size: int, policy: str | None, quantum: float | None, steps: int) -> list[Result]:
    from tests.sglang_real.harness import Engine, Prefill, set_policy

    set_policy(policy, quantum)
    decisions: list[float] = []
    questions = count_questions()

    class Timed(Engine):
        def _prefill(self) -> Prefill | None:
            start = time.perf_counter()
            record = super()._prefill()
            if record is not None:
                decisions.append(time.perf_counter() - start)
            return record

    engine = Timed(kv_tokens=2048, max_running=4096)
    sent = 0

    def refill() -> None:
        nonlocal sent
        while len(engine.waiting_queue) < size:
            client = sent % CLIENTS
            prefix = [client * 10_000 + i for i in range(PREFIX_TOKENS)]
            own = [1_000_000 + sent * OWN_TOKENS + i for i in range(OWN_TOKENS)]
            engine.add(f"r{sent}", [*prefix, *own], 2, f"c{client}")
            sent += 1

    iterations: list[float] = []
    warmup = 20
    for step in range(warmup + steps):
        refill()
        if step == warmup:
            decisions.clear()
        start = time.perf_counter()
        engine.step()
        if step >= warmup:
            iterations.append(time.perf_counter() - start)
    name = policy or "off (SGLang LPM)"
    asked = statistics.median(questions) if questions else 0
    out = []
    for what, samples in (("decision", decisions), ("iteration", iterations)):
        median, best, p99 = summarize([s * 1e6 for s in samples])
        note = f"{len(samples)} samples, {asked:g} questions/decision"
        out.append(Result("sglang-plugin", f"{what} {size} waiting, {name}", median, best, p99,
                          "us", note=note))  # fmt: skip
    questions.clear()
    return out


_QUESTIONS: list[int] = []


def count_questions() -> list[int]:
    """The number of questions of each decision (each one answered by a generator
    ``send`` on the scheduler thread), recorded as decisions close."""
    from fairserve.sglang.decision import Decision

    if not getattr(Decision, "_bench_counted", False):
        close = Decision.close

        def counted(self: Decision) -> list[Any]:
            admitted = close(self)
            _QUESTIONS.append(self.asked)
            return admitted

        Decision.close = counted  # type: ignore[method-assign]
        Decision._bench_counted = True  # type: ignore[attr-defined]
    _QUESTIONS.clear()
    return _QUESTIONS


def answer_cost(questions: int = 5000, repeats: int = 5) -> Result:
    """One answer's cost alone: µs per question of a trivial decision driven through the
    plugin's :class:`~fairserve.sglang.decision.Decision`."""
    from fairserve.core.types import Request
    from fairserve.sched.local.base import FIT
    from fairserve.sched.local.base import Decision as PolicyDecision
    from fairserve.sglang.decision import Decision

    items = [Request(f"r{i}", "c", b"", 1, 0.0) for i in range(questions)]

    def decide() -> PolicyDecision:
        admitted = []
        for req in items:
            if (yield req) is FIT:
                admitted.append(req)
        return admitted

    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        decision = Decision([], {}, {}, decide())
        while decision.question is not None:
            decision.answer(FIT)
        decision.close()
        samples.append((time.perf_counter() - start) / questions * 1e6)
    median, best, _ = summarize(samples)
    return Result("sglang-plugin", "answer per question (generator send)", median, best, None,
                  "us", note=f"{repeats} x {questions} questions")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per case")
    args = parser.parse_args(argv)
    if not 1 <= args.steps <= 100_000:
        parser.error("--steps: expected 1..100000")
    from tests.sglang_real.harness import environment_for_plugin

    os.environ.update(environment_for_plugin("dlpm"))
    from sglang.srt.plugins import load_plugins

    load_plugins()
    results: list[Result] = [answer_cost()]
    for size in SIZES:
        for policy, quantum in POLICIES:
            results += bench(size, policy, quantum, args.steps)
    if args.json:
        print_json(results)
    else:
        print(f"# {platform.python_implementation()} {platform.python_version()}, "
              f"{os.cpu_count()} CPUs")  # fmt: skip
        print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
