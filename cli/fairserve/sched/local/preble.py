"""Preble's local scheduler (Srivatsa et al., "Preble: Efficient Distributed Prompt
Scheduling for LLM Serving", ICLR 2025, §3.3 and Algorithm 3; code: WukLab/preble,
schedule heuristic ``fcfs-mpq``): the "multi-level priority wait queue" the DoubleQ paper
credits for Preble's starvation avoidance (§6.2), modelled as the baseline DoubleQ is
compared with.

Why it matters: LPM is shortest-job-first on document workloads (a cache hit extends a few
tokens, a miss a whole document), so cache-aware dispatch with LPM locally is a stronger
baseline for the well-behaved clients than Preble ever was. Preble instead sorts waiting
requests into ``priority_groups`` groups by cache-hit ratio and gives the groups turns in
proportion to their priority, so that misses are not starved behind hits.

The rule, as in Preble's code (defaults from it: 10 groups, ``k = 10``):

* A request is put in a group when the scheduler first sees it, by the fraction of its
  prompt cached then: group 0 holds the requests with nothing cached, group ``g`` those
  with a hit ratio in ``(g/P, (g+1)/P]`` (P = ``priority_groups``). It stays there while
  it waits (Preble does not regroup; a retracted request is regrouped, as Preble puts it
  back into the arrival queue). The ratio is computed in integers, so 30% of a prompt is
  group 2 of 10, where the code's floating point may say 3.
* Each batching step gives one group its turn, cycling from the highest group down and
  skipping empty groups; in its turn group ``g`` admits up to ``(g + 1)·group_quota``
  requests, first come first served, skipping those that do not fit (the turn goes on).
* Departure, for work conservation: a turn that admits nothing hands over to the next
  group in the same decision (Preble's engine loops again at once when nothing runs, and
  decodes one step first when something does), so a worker is never left idle while a
  waiting request fits. ``fill_other_groups=true`` goes further: after the first group's
  turn the following groups take their turns in the same decision, pass after pass,
  until the engine is full or nothing more fits (strict work conservation, the setting
  the shared property tests use); the cycle still advances one group per decision.

No starvation: a waiting request's group is never empty, so it gets a turn at least once
every ``priority_groups`` decisions, and only requests that arrived before it in its group
go first; a turn admits at least one of them while they fit. Hence a request with ``n``
requests ahead of it in its group is admitted within ``priority_groups·(n + 1)``
decisions while the requests ahead of it fit (``tests/sched/test_local_preble.py``).
No isolation: nothing in the rule looks at clients, so a client that sends more requests
or longer prompts gets more service (DoubleQ §6.2).

Not modelled: Preble's global scheduler (E2 dispatch, prefix replication and migration)
is a dispatcher's job; the paper table pairs this policy with ``cache-aware`` dispatch.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from fairserve.core.types import Request
from fairserve.sched.local.base import (
    EXHAUSTED,
    FIT,
    Answer,
    Decision,
    LocalPolicy,
    MatchLen,
    register_local,
)
from fairserve.sched.params import Params, param

_ARRIVAL = attrgetter("arrival_s")


@dataclass(frozen=True, slots=True)
class PrebleParams(Params):
    """Preble's priority groups (defaults from its code: ``multi_priority_queue`` of 10
    groups, ``k = 10``)."""

    priority_groups: int = param(
        10,
        "groups by cache-hit ratio (P); group g holds hit ratios in (g/P, (g+1)/P], 0 none",
        minimum=1,
    )
    group_quota: int = param(
        10,
        "k: in its turn group g admits up to (g + 1) * k requests (higher hit ratio, more)",
        minimum=1,
    )
    fill_other_groups: bool = param(
        False,
        "after the first group's turn, the next groups take theirs in the same decision "
        "(strict work conservation; Preble admits from one group per step)",
    )


@register_local
class Preble(LocalPolicy):
    """Priority groups by cache-hit ratio, served in turns weighted by priority."""

    name = "preble"
    description = (
        "Preble's local scheduler: groups by cache-hit ratio, turns weighted by hit ratio, "
        "FCFS within a group (no starvation, no isolation)"
    )
    config: PrebleParams

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.next_group = self.config.priority_groups - 1
        """Where the next decision starts looking for a non-empty group (cycles down)."""
        self._group: dict[Request, int] = {}
        """The group of every waiting request seen by a decision (fixed while it waits)."""

    # ------------------------------------------------------------ groups
    def group_of(self, matched_tokens: int, input_tokens: int) -> int:
        """Preble's group: 0 with nothing cached, else ``ceil(ratio·P) − 1``."""
        groups = self.config.priority_groups
        if matched_tokens <= 0 or input_tokens <= 0:
            return 0
        matched = min(matched_tokens, input_tokens)
        return -(-matched * groups // input_tokens) - 1

    def _groups(self, waiting: Sequence[Request], match_len: MatchLen) -> list[list[Request]]:
        """The waiting requests by group, each group first come first served."""
        groups: list[list[Request]] = [[] for _ in range(self.config.priority_groups)]
        known = self._group
        for req in sorted(waiting, key=_ARRIVAL):  # stable: queue position breaks ties
            group = known.get(req)
            if group is None:
                group = known[req] = self.group_of(match_len(req), req.input_tokens)
            groups[group].append(req)
        return groups

    def _turn_order(self, groups: list[list[Request]]) -> list[int]:
        """The non-empty groups in turn order, from :attr:`next_group` downwards."""
        count = len(groups)
        order = [(self.next_group - i) % count for i in range(count)]
        return [g for g in order if groups[g]]

    # ------------------------------------------------------------ decision
    def decide(self, waiting: Sequence[Request], match_len: MatchLen, now_s: float) -> Decision:
        """Turns in group order; see the module docstring for who goes when."""
        groups = self._groups(waiting, match_len)
        turns = self._turn_order(groups)
        admitted: list[Request] = []
        if not turns:
            return admitted
        fill = self.config.fill_other_groups
        first: int | None = None
        pending = turns
        while pending:
            progress = False
            for group in pending:
                got, exhausted = yield from self._turn(groups[group], group, match_len, now_s)
                admitted.extend(got)
                progress = progress or bool(got)
                if got and first is None:
                    first = group
                if exhausted or (got and not fill):
                    pending = []
                    break
            else:
                pending = [g for g in turns if groups[g]] if progress and fill else []
        # like one Preble step: the cycle moves below the group that admitted (or, if none
        # did, below the group whose turn it was)
        self.next_group = ((turns[0] if first is None else first) - 1) % len(groups)
        return admitted

    def _turn(
        self, queue: list[Request], group: int, match_len: MatchLen, now_s: float
    ) -> Generator[Request, Answer, tuple[list[Request], bool]]:
        """One group's turn: up to its quota, first come first served, skipping what does
        not fit. Tried requests leave ``queue`` (each is offered once per decision).
        Returns the admitted requests and whether the engine said EXHAUSTED."""
        quota = (group + 1) * self.config.group_quota
        admitted: list[Request] = []
        exhausted = False
        tried = 0
        for req in queue:
            tried += 1
            answer = yield req
            if answer is FIT:
                self.on_admit(req, max(0, req.input_tokens - match_len(req)), now_s)
                admitted.append(req)
                if len(admitted) >= quota:
                    break
            elif answer is EXHAUSTED:
                exhausted = True
                break
        del queue[:tried]
        return admitted, exhausted

    # ------------------------------------------------------------ hooks
    def _admitted(self, req: Request, extend_tokens: int, now_s: float) -> None:
        self._group.pop(req, None)

    def _finished(self, req: Request, now_s: float) -> None:
        self._group.pop(req, None)

    def on_retract(self, req: Request, now_s: float) -> None:
        """Back in the queue: regrouped by its hit ratio at the next decision."""
        super().on_retract(req, now_s)
        self._group.pop(req, None)

    def snapshot(self) -> dict[str, Any]:
        out = super().snapshot()
        out["next_group"] = self.next_group
        out["grouped_waiting"] = len(self._group)
        return out
