"""The policy's decision inside SGLang's real admission loop runs on the scheduler thread
(no helper thread) and hears what the loop did with each request it asked about: FIT for
what ``PrefillAdder`` took, NO_FIT for one skipped, EXHAUSTED when the loop stops."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from tests.sglang_real.real import require_sglang

require_sglang()

from sglang.srt.managers.schedule_policy import AddReqResult  # noqa: E402

from fairserve.core.types import Request  # noqa: E402
from fairserve.sched.local.base import (  # noqa: E402
    EXHAUSTED,
    FIT,
    NO_FIT,
    Answer,
    Decision,
    MatchLen,
)
from tests.sglang_real.harness import Engine, set_policy  # noqa: E402

STEPS = 60
PREFIX = [700 + i for i in range(40)]

Heard = list[tuple[str, Answer, int]]


def listen(engine: Engine) -> list[Heard]:
    """Wrap the host's policy so every decision logs (rid, answer, thread) per question."""
    assert engine.host is not None
    policy = engine.host.policy
    original = policy.decide
    log: list[Heard] = []

    def decide(waiting: Sequence[Request], match_len: MatchLen, now_s: float) -> Decision:
        heard: Heard = []
        log.append(heard)
        inner = original(waiting, match_len, now_s)
        try:
            req = next(inner)
            while True:
                answer = yield req
                heard.append((req.id, answer, threading.get_ident()))
                req = inner.send(answer)
        except StopIteration as end:
            admitted: list[Request] = end.value
            return admitted

    policy.decide = decide  # type: ignore[method-assign]
    return log


@pytest.mark.parametrize(
    ("kv_tokens", "max_running"),
    [(700, 32), (4000, 8)],
    ids=["kv-bound", "running-bound"],
)
def test_the_decision_runs_on_the_scheduler_thread_and_hears_the_loop(
    kv_tokens: int, max_running: int
) -> None:
    """kv-bound: the loop stops at a request the adder could not take (NO_TOKEN, budget
    spent); running-bound: it stops after one it took (the batch is full) and the policy
    hears EXHAUSTED when the scheduler's next event closes the decision."""
    set_policy("dlpm", 60.0)
    engine = Engine(kv_tokens=kv_tokens, max_running=max_running)
    log = listen(engine)
    seen: set[Answer] = set()
    stopped_at_offer = stopped_after_fit = 0
    for step in range(STEPS):
        if step < 40:
            for k in range(3):
                start = 10_000 + step * 100 + k * 30
                engine.add(f"f{step}-{k}", [*PREFIX, *range(start, start + 30)], 12, "flood")
            if step % 4 == 0:
                start = 50_000 + step * 100
                engine.add(f"l{step}", range(start, start + 90), 12, "light")
        before = len(log)
        record = engine.step()
        decisions = log[before:]
        if record.prefill is None or not decisions:
            continue
        assert len(decisions) == 1
        heard = decisions[0]
        answers = [answer for _, answer, _ in heard]
        seen.update(answers)
        assert {thread for _, _, thread in heard} == {threading.get_ident()}
        assert [rid for rid, answer, _ in heard if answer is FIT] == record.prefill.admitted
        if EXHAUSTED in answers:  # once, and nothing asked after it
            assert answers.index(EXHAUSTED) == len(answers) - 1, heard
            stopped_after_fit += answers[-2:] == [FIT, EXHAUSTED]
        offers = record.prefill.offers
        last = offers[-1] if offers else None
        asked = [rid for rid, _, _ in heard]
        if last is not None and last.result != AddReqResult.CONTINUE and last.rid in asked:
            # The adder's result stopped the loop: EXHAUSTED for that request (or, when the
            # adder took it, for the policy's next question).
            at = len(asked) - 1 - asked[::-1].index(last.rid)
            after = answers[at + 1 :] if last.admitted else answers[at:]
            assert after == [EXHAUSTED], (record.prefill, heard)
            stopped_at_offer += 1
    if kv_tokens == 700:
        assert {FIT, NO_FIT, EXHAUSTED} <= seen and stopped_at_offer >= 1, seen
    else:
        assert {FIT, EXHAUSTED} <= seen and stopped_after_fit >= 1, seen
