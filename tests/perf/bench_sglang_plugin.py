"""What the SGLang plugin costs per batching step, inside SGLang's real scheduling objects.

    .venv-sglang/bin/python tests/perf/bench_sglang_plugin.py [--json] [--steps 100]
        [--sizes 10,100,1000,10000] [--clock cpu|wall]

Needs SGLang (the ``.[sglang]`` environment, as ``tests/sglang_real``); no GPU, no model.
The queue is kept at each size (six clients with shared prefixes, refilled every step) while
the engine admits what its KV pool takes and decodes. For each size it times SGLang's
batching decision (``SchedulePolicy.calc_priority`` plus the admission loop over
``PrefillAdder.add_one_req``), the plugin's part of it alone (``PolicyHost.begin_decision``:
the waiting requests' matches and the policy's ordering) and the whole iteration, with the
plugin disabled (SGLang's own LPM ordering; SGLang switches LPM to FCFS above 128 waiting
requests) and with DLPM and VTC inside it. DLPM runs with the three ways of getting match
lengths: ``prefix_len`` (what SGLang's own matching left: nothing new above 128 waiting,
the plugin before kept matches), ``walk`` (every waiting request matched in SGLang's tree
at every step) and ``kept`` (:mod:`fairserve.sglang.matches`, the plugin's default).
Times are the scheduler thread's CPU time by default (``--clock cpu``: on a machine shared
with other jobs, wall time mostly measures their load) or wall time (``--clock wall``).
Medians, best and p99 over the steps that made a decision; the note gives the policy's
questions and SGLang's offers (``add_one_req`` calls) per decision and, with kept matches,
the share of matches answered without a walk. First rows: the cost of one answer alone (a
generator ``send`` into the policy's ``decide``, ``sglang/decision.py``) and of one waiting
request's match in a real ``UnifiedRadixCache`` when nothing changed on its path, kept vs
walked, for short and long prompts (``--prompt-tokens``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "cli"):  # runnable as a script from any directory
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from tests.perf.timing import Result, print_json, print_table, summarize  # noqa: E402

SIZES = (10, 100, 1000, 10_000)
CASES: tuple[tuple[str | None, float | None, str | None, bool], ...] = (
    (None, None, None, True),
    ("dlpm", 256.0, "prefix_len", True),
    ("dlpm", 256.0, "walk", True),
    ("dlpm", 256.0, "kept", False),
    ("dlpm", 256.0, "kept", True),
    ("vtc", None, "kept", True),
)
"""(policy, quantum, matches, bounded): None is the plugin disabled (SGLang's own ordering);
``bounded`` False offers SGLang every request the policy asks about (``PolicyHost.bound``
None: the plugin before it knew which requests SGLang must refuse)."""
CLIENTS = 6
PREFIX_TOKENS = 48
OWN_TOKENS = 16


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def bench(
    size: int,
    policy: str | None,
    quantum: float | None,
    matching: str | None,
    steps: int,
    clock: Callable[[], float] = time.thread_time,
    bounded: bool = True,
) -> list[Result]:
    from fairserve.sglang.host import PolicyHost
    from fairserve.sglang.matches import KeptMatches
    from tests.sglang_real.harness import Engine, Prefill, set_policy

    set_policy(policy, quantum)
    decisions: list[float] = []
    offers: list[int] = []
    begins: list[float] = []
    questions = count_questions()

    class Timed(Engine):
        def _prefill(self) -> Prefill | None:
            start = clock()
            record = super()._prefill()
            if record is not None:
                decisions.append(clock() - start)
                offers.append(len(record.offers))
            return record

    engine = Timed(kv_tokens=2048, max_running=4096)
    host = engine.host
    if host is not None:
        if not bounded:
            host.bound = None
        host.matches = None if matching == "prefix_len" else KeptMatches(keep=matching != "walk")
        begin = PolicyHost.begin_decision

        def timed_begin(waiting: list[Any], cache: Any = None) -> None:
            start = clock()
            begin(host, waiting, cache)
            begins.append(clock() - start)

        host.begin_decision = timed_begin  # type: ignore[method-assign]
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
    warmup = min(10, steps)
    for step in range(warmup + steps):
        refill()
        if step == warmup:
            decisions.clear()
            offers.clear()
            begins.clear()
            if host is not None and host.matches is not None:
                host.matches.walks = host.matches.reused = 0
        start = clock()
        engine.step()
        if step >= warmup:
            iterations.append(clock() - start)
    name = policy or "off (SGLang LPM)"
    if matching is not None:
        name += f", {matching}"
    if not bounded:
        name += ", every request offered"
    asked = statistics.median(questions) if questions else 0
    offered = statistics.median(offers) if offers else 0
    note = f"{asked:g} questions, {offered:g} offers/decision"
    kept = host.matches if host is not None else None
    if kept is not None and kept.keep and kept.walks + kept.reused:
        note += f", {kept.reused / (kept.walks + kept.reused):.1%} matches kept"
    out = []
    for what, samples in (("decision", decisions), ("plugin", begins), ("iteration", iterations)):
        if not samples:
            continue
        median, best, p99 = summarize([s * 1e6 for s in samples])
        out.append(Result("sglang-plugin", f"{what} {size} waiting, {name}", median, best, p99,
                          "us", note=f"{len(samples)} samples, {note}"))  # fmt: skip
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


def match_cost(waiting: int, prompt_tokens: int, repeats: int = 20) -> list[Result]:
    """µs per waiting request of a decision's matches (``KeptMatches``, walked every time
    and kept) in SGLang's radix cache holding four shared documents and a quarter of the
    waiting prompts (admitted before), with nothing changed between decisions."""
    import random

    from fairserve.sglang.matches import KeptMatches
    from tests.sglang_real.trees import Tree, make_req

    tree = Tree(random.Random(0), kv_tokens=8 * prompt_tokens + waiting * 16)
    documents = [[d * 1_000_000 + i for i in range(prompt_tokens)] for d in range(1, 5)]
    for document in documents:
        tree.insert(document, None)
    shared = max(1, prompt_tokens - 10)
    reqs = [
        make_req(f"r{i}", [*documents[i % 4][:shared], 5_000_000 + i, *range(8)], None)
        for i in range(waiting)
    ]
    for req in reqs[::4]:
        tree.insert(list(req.origin_input_ids)[: shared + 2], None)
    out = []
    for keep in (False, True):
        matches = KeptMatches(keep=keep)
        samples = []
        for _ in range(repeats):
            start = time.thread_time()
            length = matches.begin(tree.cache)
            assert length is not None, "needs SGLang's Python radix tree core"
            for req in reqs:
                length(req)
            matches.end()
            samples.append((time.thread_time() - start) / waiting * 1e6)
        median, best, _ = summarize(samples[1:])  # the first decision walks every match
        how = "kept" if keep else "walk"
        out.append(Result("sglang-plugin", f"match per request {waiting} waiting, "
                          f"{prompt_tokens}-token prompts, {how}", median, best, None, "us",
                          note=f"{repeats - 1} decisions, CPU time"))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per case")
    parser.add_argument(
        "--clock", choices=sorted(CLOCKS), default="cpu",
        help="scheduler thread CPU time (default) or wall time",
    )  # fmt: skip
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="waiting requests, comma-separated"
    )
    parser.add_argument(
        "--prompt-tokens", default="64,2000", help="prompt lengths of the match rows"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.steps <= 100_000:
        parser.error("--steps: expected 1..100000")
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
        prompts = [int(x) for x in args.prompt_tokens.split(",")]
    except ValueError:
        parser.error("--sizes, --prompt-tokens: expected comma-separated integers")
    if not all(1 <= size <= 100_000 for size in sizes):
        parser.error("--sizes: expected 1..100000 each")
    if not all(16 <= tokens <= 32_000 for tokens in prompts):
        parser.error("--prompt-tokens: expected 16..32000 each")
    from tests.sglang_real.harness import environment_for_plugin

    os.environ.update(environment_for_plugin("dlpm"))
    from sglang.srt.plugins import load_plugins

    load_plugins()
    results: list[Result] = [answer_cost()]
    for size in sizes:
        for tokens in prompts:
            results += match_cost(size, tokens)
    for size in sizes:
        for policy, quantum, matching, bounded in CASES:
            results += bench(
                size, policy, quantum, matching, args.steps, CLOCKS[args.clock], bounded
            )
    if args.json:
        print_json(results)
    else:
        print(f"# {platform.python_implementation()} {platform.python_version()}, "
              f"{os.cpu_count()} CPUs, {args.clock} time")  # fmt: skip
        print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
