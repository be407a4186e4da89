"""One batching decision inside SGLang's admission loop.

SGLang's loop visits its waiting queue in list order and offers each request to
``PrefillAdder.add_one_req``; the policy's ``select`` (running in a
:class:`~fairserve.sglang.stepped.SteppedSelect`) wants to be asked about requests in *its*
order. The two meet because a Python ``for`` over a list reads ``list[i]`` afresh at every
step: after each answer, the request the policy asks about next is moved to the slot right
after the current one (a permutation of the part the loop has not reached, so the list keeps
its length and elements). The loop therefore offers exactly the requests the policy asks
about, in its order; the ones it skips for lack of credit stay behind, and once ``select``
has finished the loop is told to stop.

If the loop passes over the request the policy asked about on its own account (LoRA slots,
a storage prefetch still running), that request "does not fit" this time, like any other
request the engine cannot take now.
"""

from __future__ import annotations

from typing import Any

from fairserve.core.types import Request
from fairserve.sglang.stepped import SteppedSelect


class Decision:
    """The waiting list SGLang iterates, the policy's pending question, the admissions."""

    def __init__(
        self,
        waiting: list[Any],
        origin: dict[int, Any],
        matched: dict[int, int],
        step: SteppedSelect,
    ) -> None:
        self.waiting = waiting
        self.origin = origin
        """id(core request) → SGLang request."""
        self.matched = matched
        """id(core request) → the prefix match the policy was told (``match_len``)."""
        self.step = step
        self.cursor = 0
        self.admitted: list[tuple[Request, int]] = []
        """(core request, real extend tokens) in admission order."""

    @property
    def question(self) -> Request | None:
        return self.step.question

    def locate(self, sreq: Any) -> int:
        """Index of the request the loop offers now (from the cursor on: the loop only moves
        forward); -1 when it is not in the list at all."""
        waiting = self.waiting
        for index in range(self.cursor, len(waiting)):
            if waiting[index] is sreq:
                return index
        for index in range(min(self.cursor, len(waiting))):
            if waiting[index] is sreq:
                return index
        return -1

    def skip_to(self, req: Request) -> bool:
        """Answer "does not fit" to questions the loop passed over until the policy asks
        about ``req``; False when ``select`` finished without asking about it."""
        while self.step.question is not None and self.step.question is not req:
            self.step.answer(False)
        return self.step.question is req

    def answer(self, fits: bool, position: int) -> None:
        """Answer the pending question (about the request at ``position``) and put the next
        request the policy asks about right after it."""
        self.step.answer(fits)
        self.bring_forward(position)

    def bring_forward(self, position: int) -> None:
        """Move the pending question's request to ``position + 1`` (``-1``: to the front).

        A question about a request the loop has already passed is answered "does not fit"
        (it cannot be offered again in this decision)."""
        waiting = self.waiting
        while (question := self.step.question) is not None:
            sreq = self.origin[id(question)]
            target = position + 1
            found = -1
            for index in range(target, len(waiting)):
                if waiting[index] is sreq:
                    found = index
                    break
            if found < 0:
                self.step.answer(False)
                continue
            if found != target:
                waiting.insert(target, waiting.pop(found))
            self.cursor = target
            return

    def close(self) -> list[Request]:
        """End the decision: everything not asked yet does not fit; ``select``'s admissions."""
        return self.step.close()
