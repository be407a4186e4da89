"""One batching decision inside SGLang's admission loop.

SGLang's loop visits its waiting queue in list order and offers each request to
``PrefillAdder.add_one_req``; the policy's decision (its ``decide`` generator, see
:mod:`fairserve.sched.local.base`) yields the requests it wants to be asked about in *its*
order and receives an answer for each: ``FIT`` (the adder took it), ``NO_FIT`` (skip it,
try the others) or ``EXHAUSTED`` (the loop stops: the engine's budget is spent). The
generator runs on the scheduler thread, between two answers, so there is no helper thread
and no hand-off: an answer costs one generator ``send``.

The two orders meet because a Python ``for`` over a list reads ``list[i]`` afresh at every
step: after each answer, the request the policy asks about next is moved to the slot right
after the current one (a permutation of the part the loop has not reached, so the list keeps
its length and elements). The loop therefore offers exactly the requests the policy asks
about, in its order; the ones it skips for lack of credit stay behind, and once the decision
has finished the loop is told to stop.

If the loop passes over the request the policy asked about on its own account (LoRA slots,
a storage prefetch still running), that request "does not fit" this time, like any other
request the engine cannot take now.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairserve.core.types import Request
from fairserve.sched.local.base import EXHAUSTED, NO_FIT, Answer
from fairserve.sched.local.base import Decision as PolicyDecision


class Decision:
    """The waiting list SGLang iterates, the policy's pending question, the admissions."""

    def __init__(
        self,
        waiting: list[Any],
        origin: Mapping[Request, Any],
        matched: Mapping[Request, int],
        decide: PolicyDecision,
    ) -> None:
        self.waiting = waiting
        self.origin = origin
        """Core request → SGLang request."""
        self.matched = matched
        """Core request → the prefix match the policy was told (``match_len``)."""
        self._decide = decide
        self.question: Request | None = None
        """The request the policy asks about now; None once its decision has finished."""
        self.asked = 0
        """Questions the policy asked in this decision."""
        self.chosen: list[Request] = []
        """The policy's admissions, once its decision has finished."""
        self.cursor = 0
        self.admitted: list[tuple[Request, int]] = []
        """(core request, real extend tokens) in admission order."""
        self.needs: Mapping[Request, int | None] = {}
        """Core request → KV tokens SGLang's adder charges it at least (absent or None:
        unknown; see :meth:`fairserve.sglang.host.PolicyHost.admit`)."""
        self.least_need: int | None = None
        """The smallest of :attr:`needs` over every candidate (None: one is unknown)."""
        self.ignores_eos = False
        """A candidate ignores its end of sequence (SGLang admits such requests by rules of
        its own when its prefix cache is disabled)."""
        self._advance(None)

    def _advance(self, answer: Answer | None) -> None:
        """Give the policy ``answer`` (None: start) and take its next question."""
        try:
            question = next(self._decide) if answer is None else self._decide.send(answer)
        except StopIteration as end:
            self.question = None
            self.chosen = end.value or []
            return
        self.question = question
        self.asked += 1

    def answer(self, answer: Answer) -> Request | None:
        """Answer the pending question; returns the next one (None: the decision ended)."""
        if self.question is None:
            raise RuntimeError("no question to answer: the decision has finished")
        self._advance(answer)
        return self.question

    def locate(self, sreq: Any) -> int:
        """Index of the request the loop offers now (from the cursor on: the loop only moves
        forward); -1 when it is not in the list at all."""
        index = _index(self.waiting, sreq, self.cursor)
        if index < 0:
            index = _index(self.waiting[: self.cursor], sreq, 0)
        return index

    def skip_to(self, req: Request) -> bool:
        """Answer "does not fit" to questions the loop passed over until the policy asks
        about ``req``; False when the decision finished without asking about it."""
        while self.question is not None and self.question is not req:
            self._advance(NO_FIT)
        return self.question is req

    def skip_unfit(self, room: float) -> None:
        """Answer "does not fit" to questions about requests that need at least ``room``
        tokens, without offering them: SGLang would match each one (``init_next_round_input``)
        only to answer ``NO_TOKEN``, which the policy hears as the same ``NO_FIT``."""
        needs = self.needs
        while (question := self.question) is not None:
            need = needs.get(question)
            if need is None or need < room:
                return
            self._advance(NO_FIT)

    def bring_forward(self, position: int) -> None:
        """Move the pending question's request to ``position + 1`` (``-1``: to the front).

        A question about a request the loop has already passed is answered "does not fit"
        (it cannot be offered again in this decision)."""
        waiting = self.waiting
        while (question := self.question) is not None:
            sreq = self.origin[question]
            target = position + 1
            found = _index(waiting, sreq, target)
            if found < 0:
                self._advance(NO_FIT)
                continue
            if found != target:
                waiting.insert(target, waiting.pop(found))
            self.cursor = target
            return

    def close(self) -> list[Request]:
        """End the decision: the engine takes nothing more (``EXHAUSTED``, repeated for a
        policy that asks again); the policy's admissions."""
        while self.question is not None:
            self._advance(EXHAUSTED)
        return self.chosen


def _index(waiting: list[Any], sreq: Any, start: int) -> int:
    """Position of ``sreq`` (this very object) at or after ``start``; -1 if absent.

    ``list.index`` searches in C (an identity check first): with 1,000 waiting requests a
    Python loop per question made the decision quadratic. An ``__eq__`` that matched
    another object (SGLang's ``Req`` has none) falls back to the loop."""
    try:
        index = waiting.index(sreq, start)
    except ValueError:
        return -1
    if waiting[index] is sreq:
        return index
    for index in range(start, len(waiting)):
        if waiting[index] is sreq:
            return index
    return -1
