"""Preble's global scheduler, E2 (Srivatsa et al., "Preble: Efficient Distributed Prompt
Scheduling for LLM Serving", ICLR 2025, §3.2 and Algorithm 1), as Preble's code runs it
(WukLab/preble, ``preble/global_scheduler_with_time.py``: ``GlobalSchedulerWithTime``,
built by ``preble/server/server.py`` with eviction and rebalancing on): the global side of
the baseline the DoubleQ paper compares with (§6.2, §7.1), the local side being the
``preble`` local policy.

The rule, for a request whose prompt is matched against where earlier prompts were placed
(``self.placed``: a radix tree of what each worker was sent, which, like Preble's
``gpu_allocations``, does not forget a placement when the worker evicts the prefix;
evictions only reach the fleet's cache model, ``self.prefixes``, which the prefill estimate
and any fair queue read):

* **Exploit** when more than ``exploit_ratio`` of the prompt was placed on some worker
  (``runtime_selector``: the new leaf's own tokens fewer than the matched context, i.e.
  more than half the prompt matched): the request goes to a worker holding that longest
  match, *whatever the load* (no balance test, unlike sglang-router's ``cache-aware``).
  Among several holders, the one with the lowest load cost (``calculate_min_load_cost``;
  Preble's code returns the position of that worker in the holders' set rather than its
  id, a slip not modelled here).
* **Explore** otherwise: the worker with the lowest load cost, ties in worker order
  (``np.argmin``).

Load cost of a worker (``SlidingWindowHistogram.current_allocation_per_gpu``): the prefill
time of the requests sent to it in the last ``window_s`` seconds (``window_duration =
timedelta(minutes=3)``) plus, for the requests sent to it and not yet finished, their
requested output length (``max_new_tokens``) times the worker's time per output token
(TPOT). Estimated here:

* prefill time of a request = its tokens missing on the chosen worker (prompt minus the
  worker's match when it was sent) through Preble's A6000 / Mistral-7B fit,
  ``max(prefill_floor_ms, prefill_base_ms + prefill_ms_per_token · tokens)`` (the
  ``< 192`` floor and the ``>= 384`` line of ``mistral_7b_A6000_sglang_linear`` divided by
  its 0.9 in ``model_equations.py``; the attention terms, under a millisecond below 4k
  tokens of context, and the quadratic term of extends over 4,096 tokens are left out).
  Preble charges a prefix node's windowed misses evenly to every worker it is allocated
  to and measures the miss rate against the global tree ("FIXME: miss-rate is not
  per-gpu"); here each request's misses go to the worker it was sent to.
* TPOT = the median of the worker's last ``tpot_samples`` finished requests' TPOT
  (``avg_topt_per_gpu``: ``deque(maxlen=200)`` seeded with 0.15 s), measured from the
  request's first-token and finish times where the host records them (the simulator);
  the seed ``tpot_s`` stays where it does not (the router).
* The clock is the requests' arrival times (simulated time in the simulator).

Not modelled: the rebalancing step (``handle_important_node_stealing``: once 50 requests
per worker were dispatched, prefixes move from the costliest worker to the cheapest while
the costlier is more than ``HIGH_LOAD_THRESHOLD = 1.5`` times as loaded, and a lone hot
prefix is replicated when a TTFT detector finds its worker overloaded) and Preble's
forgetting of a prefix's placement three minutes after its last hit; placements are
forgotten least recently used first past ``placement_tokens_per_worker`` instead (Preble's
own tree is never trimmed). Following the workers' evictions instead (exploring wherever
memory pressure evicted the prefix) spreads a hot client over more workers: on the
DoubleQ table's tot-s1, 366 explores instead of 38, all calls served in 971 s instead
of 1,078 s. The DoubleQ paper's account of Preble (§7.1: one
client's requests "continuously dispatched to a single GPU" for five minutes) is of
the exploit rule holding with no rebalancing effective.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from fairserve.core.errors import ConfigError
from fairserve.core.types import Request
from fairserve.sched.dispatch.base import Dispatcher, register_dispatcher
from fairserve.sched.dispatch.cache_aware import MAX_TREE_TOKENS
from fairserve.sched.dispatch.cache_model import CacheModel
from fairserve.sched.params import Params, param

MS_PER_S = 1000.0


@dataclass(frozen=True, slots=True)
class PrebleE2Params(Params):
    """Preble's E2 constants (``global_scheduler_with_time.py``, ``model_equations.py``)."""

    exploit_ratio: float = param(
        0.5,
        "exploit the worker holding the longest match when more than this share of the"
        " prompt is cached (0..1), whatever its load",
        minimum=0.0,
    )
    window_s: float = param(
        180.0,
        "load cost counts the prefill time of the requests sent in the last window_s seconds",
        minimum=0.0,
        exclusive_minimum=True,
    )
    tpot_s: float = param(
        0.15,
        "time per output token assumed until finished requests measure it (seconds)",
        minimum=0.0,
    )
    tpot_samples: int = param(
        200,
        "a worker's TPOT is the median over its last tpot_samples finished requests",
        minimum=1,
    )
    prefill_ms_per_token: float = param(
        0.10842571 / 0.9,
        "estimated prefill milliseconds per missing prompt token (Preble's A6000 fit)",
        minimum=0.0,
    )
    prefill_base_ms: float = param(
        4.209777054806409 / 0.9,
        "estimated prefill milliseconds of a request besides its tokens",
        minimum=0.0,
    )
    prefill_floor_ms: float = param(
        22.0 / 0.9,
        "estimated prefill milliseconds of a short extend (Preble's fit below 192 tokens)",
        minimum=0.0,
    )
    placement_tokens_per_worker: int = param(
        1_000_000,
        "placements remembered per worker, least recently used forgotten first (0 ="
        " unbounded; about 5x Preble's max_tokens_gpu = 198516)",
        minimum=0,
    )
    max_tree_tokens_per_worker: int = MAX_TREE_TOKENS.field()


@register_dispatcher
class PrebleE2(Dispatcher):
    """Longest cached prefix above half the prompt whatever the load, else the lowest
    windowed load cost (prefill time of recent dispatches + decode time of running ones)."""

    name = "preble-e2"
    description = (
        "Preble's E2: longest cached prefix when over half the prompt, whatever the load,"
        " else lowest recent prefill + running decode time (unfair)"
    )
    config: PrebleE2Params

    def _init_state(self) -> None:
        if self.config.exploit_ratio > 1.0:
            raise ConfigError(
                f"dispatcher {self.name}: parameter 'exploit_ratio' must be <= 1,"
                f" got {self.config.exploit_ratio:g}"
            )
        self.prefixes = CacheModel(self.config.max_tree_tokens_per_worker)
        self.placed = CacheModel(self.config.placement_tokens_per_worker)
        """Which worker each prompt was sent to; evictions do not reach it."""
        self.now_s = 0.0
        """The latest arrival time seen: the load window's clock."""
        self._window: deque[tuple[float, str, float]] = deque()
        """(dispatch time, worker, estimated prefill seconds), oldest first."""
        self.window_prefill_s: dict[str, float] = {}
        self._window_count: dict[str, int] = {}
        self.decode_tokens: dict[str, int] = {}
        """Requested output tokens of the requests sent and not finished, per worker."""
        self._tpots: dict[str, deque[float]] = {}
        self.tpot_median_s: dict[str, float] = {}
        self.decisions = {"exploit": 0, "explore": 0}

    # ------------------------------------------------------------ load cost
    def prefill_s(self, extend_tokens: int) -> float:
        """Preble's prefill-time estimate for ``extend_tokens`` computed tokens."""
        config = self.config
        linear_ms = config.prefill_base_ms + config.prefill_ms_per_token * extend_tokens
        return max(config.prefill_floor_ms, linear_ms) / MS_PER_S

    def load_cost_s(self, worker: str) -> float:
        """Windowed prefill seconds plus running requests' decode seconds."""
        decode_s = self.decode_tokens[worker] * self.tpot_median_s[worker]
        return self.window_prefill_s[worker] + decode_s

    def lowest_cost(self, candidates: list[str]) -> str:
        """Worker of lowest load cost; ties go to the first candidate (worker order)."""
        return min(candidates, key=self.load_cost_s)

    def _advance(self, now_s: float) -> None:
        """Move the clock to ``now_s`` and drop the prefill entries older than the window."""
        self.now_s = max(self.now_s, now_s)
        start_s = self.now_s - self.config.window_s
        window = self._window
        while window and window[0][0] < start_s:
            _, worker, prefill_s = window.popleft()
            self._take_prefill(worker, prefill_s)

    def _take_prefill(self, worker: str, prefill_s: float) -> None:
        count = self._window_count[worker] - 1
        self._window_count[worker] = count
        # At zero entries the sum is exactly 0 (no float residue from the subtractions).
        self.window_prefill_s[worker] = self.window_prefill_s[worker] - prefill_s if count else 0.0

    # ------------------------------------------------------------ decisions
    def _choose(self, req: Request, candidates: list[str]) -> str:
        self._advance(req.arrival_s)
        if req.input_tokens > 0:
            match = self.placed.match(req.prompt_key)
            if match.tokens > self.config.exploit_ratio * req.input_tokens:
                holders = [w for w in candidates if w in match.owners]
                if holders:
                    self.decisions["exploit"] += 1
                    return self.lowest_cost(holders)
        self.decisions["explore"] += 1
        return self.lowest_cost(candidates)

    def _dispatched(self, req: Request, worker: str) -> None:
        self._advance(req.arrival_s)
        missing = req.input_tokens - self.prefixes.walk_len(req.prompt_key, worker)
        prefill_s = self.prefill_s(missing)
        self._window.append((self.now_s, worker, prefill_s))
        self.window_prefill_s[worker] += prefill_s
        self._window_count[worker] += 1
        self.decode_tokens[worker] += req.max_output_tokens
        self.prefixes.dispatched(req.prompt_key, worker)
        self.placed.record(req.prompt_key, worker)

    def _finished(self, req: Request, worker: str, output_tokens: int) -> None:
        self._left(req, worker)
        first_s, finish_s = req.first_token_s, req.finish_s
        if first_s is not None and finish_s is not None and output_tokens > 1:
            self._measured_tpot(worker, (finish_s - first_s) / (output_tokens - 1))

    def _aborted(self, req: Request, worker: str) -> None:
        self._left(req, worker)

    def _left(self, req: Request, worker: str) -> None:
        self.decode_tokens[worker] = max(0, self.decode_tokens[worker] - req.max_output_tokens)

    def _measured_tpot(self, worker: str, tpot_s: float) -> None:
        if tpot_s <= 0:
            return  # Preble skips a zero TPOT (``func_output.tpot != 0``)
        samples = self._tpots[worker]
        samples.append(tpot_s)
        self.tpot_median_s[worker] = statistics.median(samples)

    # ------------------------------------------------------------ workers
    def _worker_added(self, worker: str) -> None:
        self.window_prefill_s[worker] = 0.0
        self._window_count[worker] = 0
        self.decode_tokens[worker] = 0
        self._tpots[worker] = deque([self.config.tpot_s], maxlen=self.config.tpot_samples)
        self.tpot_median_s[worker] = self.config.tpot_s

    def _worker_removed(self, worker: str) -> None:
        self.placed.forget(worker)
        self._window = deque(entry for entry in self._window if entry[1] != worker)
        for table in (
            self.window_prefill_s,
            self._window_count,
            self.decode_tokens,
            self._tpots,
            self.tpot_median_s,
        ):
            del table[worker]

    # ------------------------------------------------------------ state
    def _worker_state(self, worker: str) -> dict[str, Any]:
        return {
            "tree_tokens": self.prefixes.worker_tokens(worker),
            "placed_tokens": self.placed.worker_tokens(worker),
            "load_cost_s": self.load_cost_s(worker),
            "window_prefill_s": self.window_prefill_s[worker],
            "decode_tokens": self.decode_tokens[worker],
            "tpot_s": self.tpot_median_s[worker],
        }

    def _extra_state(self, clients: Collection[str] | None) -> dict[str, Any]:
        return {"tree_tokens": self.prefixes.total_tokens, "decisions": dict(self.decisions)}
