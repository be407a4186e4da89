"""A policy's ``select`` run one ``can_fit`` question at a time.

Every host drives a local policy through ``select(waiting, can_fit, match_len, now_s)``: the
policy walks its candidates and asks ``can_fit(req)`` of each one it wants to admit. SGLang
turns this inside out: *its* loop walks the waiting queue and offers each request to
``PrefillAdder.add_one_req``. To run the policy's own ``select`` unchanged (so the plugin
decides exactly what the simulator decides), ``select`` runs in a helper thread that stops at
every ``can_fit`` until the scheduler thread answers it.

Only one of the two threads runs at any moment: :meth:`SteppedSelect.answer` returns only
once the helper has posted its next question or finished. So the policy is never touched by
two threads at once, and the decisions are deterministic (tensor-parallel ranks, which each
run their own copy, decide the same). A question costs two thread hand-offs (tens of µs);
once the engine's budget is spent, :meth:`SteppedSelect.close` answers every remaining
question "no" inside the helper, without hand-offs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fairserve.core.types import Request

CanFit = Callable[[Request], bool]
Select = Callable[[CanFit], list[Request]]
"""``select`` with everything but ``can_fit`` bound."""


class SteppedSelect:
    """One batching decision in progress: the pending question, and the answers so far.

    The hand-off is a pair of plain locks used as binary semaphores (the cheapest blocking
    primitive): the scheduler thread releases ``_to_helper`` and waits on ``_to_main``, the
    helper the other way round, so exactly one of them runs at any time."""

    def __init__(self, select: Select, runner: SelectThread | None = None) -> None:
        self._to_helper = threading.Lock()
        self._to_main = threading.Lock()
        self._to_helper.acquire()
        self._to_main.acquire()
        self._question: Request | None = None
        self._answer = False
        self._closing = False
        self._done = False
        self._error: BaseException | None = None
        self.admitted: list[Request] = []
        self.asked = 0
        self._select = select
        (runner or SelectThread()).run(self)
        self._to_main.acquire()  # the first question, or the end
        self._raise()

    @property
    def question(self) -> Request | None:
        """The request ``select`` asks about now; None once it has finished."""
        return self._question

    @property
    def done(self) -> bool:
        return self._done

    def answer(self, fits: bool) -> Request | None:
        """Answer the pending question; returns the next one (None: ``select`` finished)."""
        if self._question is None:
            raise RuntimeError("no question to answer: select has finished")
        self._question = None
        self._answer = fits
        self._to_helper.release()
        self._to_main.acquire()
        self._raise()
        return self._question

    def close(self) -> list[Request]:
        """Answer "does not fit" to everything left, wait for ``select``; the admitted list."""
        self._closing = True
        if not self._done:
            self._question = None
            self._answer = False
            self._to_helper.release()
            self._to_main.acquire()
        self._raise()
        return self.admitted

    # ------------------------------------------------------------ the helper thread
    def _run(self) -> None:
        try:
            self.admitted = self._select(self._can_fit)
        except BaseException as exc:  # handed to the scheduler thread, raised there
            self._error = exc
        self._done = True
        self._question = None
        self._to_main.release()

    def _can_fit(self, req: Request) -> bool:
        if self._closing:
            return False
        self.asked += 1
        self._question = req
        self._to_main.release()
        self._to_helper.acquire()
        return self._answer

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error


class SelectThread:
    """A long-lived helper thread for one host's decisions (starting a thread per decision
    costs more than a decision's hand-offs). Decisions never overlap: the scheduler thread
    closes one before it starts the next."""

    def __init__(self) -> None:
        self._ready = threading.Lock()
        self._ready.acquire()
        self._job: SteppedSelect | None = None
        self._thread: threading.Thread | None = None

    def run(self, job: SteppedSelect) -> None:
        """Hand ``job`` to the helper thread (started on first use)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="fairserve-select", daemon=True)
            self._thread.start()
        self._job = job
        self._ready.release()

    def _loop(self) -> None:
        while True:
            self._ready.acquire()
            job, self._job = self._job, None
            if job is not None:
                job._run()
