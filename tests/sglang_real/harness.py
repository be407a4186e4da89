"""SGLang's scheduler loop on the CPU, with SGLang's own scheduling objects and no model.

A real SGLang server cannot start on a machine without a GPU (its CPU backend needs kernels
that are not on PyPI), but everything that *decides* runs here: ``ServerArgs``,
``SchedulePolicy`` (LPM ordering), ``PrefillAdder`` (admission against the KV budget),
``ReqToTokenPool`` / ``MHATokenToKVPool`` / ``TokenToKVPoolAllocator`` on ``device="cpu"``,
``UnifiedRadixCache`` with its Python tree core (evictions, its event recorder), ``Req`` and
``ScheduleBatch`` (``init_new``, ``prepare_for_extend``, ``merge_batch``, ``filter_batch``,
``check_decode_mem``, ``retract_decode``, ``prepare_for_decode``).

:class:`Engine` is one scheduler: each :meth:`Engine.step` is one iteration of SGLang's event
loop, written after ``Scheduler._get_new_batch_prefill_raw`` and ``update_running_batch``
(no chunked prefill, no mixed batches, no overlap): receive (the leader's
``_poll_timeout_aborts`` whose result rides into ``process_input_requests``), merge the last
prefill batch, a prefill batch if one can be built, else a decode step (retracting when the
KV pool is full), a forward, ``process_batch_result``. The ``Scheduler`` methods the plugin
hooks are SGLang's own, called on a ``Scheduler`` object built without ``__init__`` (which
needs a model); what they would hand to the model, the tokenizer process or metrics goes to
small stand-ins at the bottom of this file, never to the plugin. Only ``Scheduler.__init__``
itself cannot run: :meth:`Engine.__init__` calls the plugin's after-hook for it.
"""

from __future__ import annotations

import importlib
import json
import os
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import (
    NewTokenRatioTracker,
)
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from fairserve.sglang import hooks
from fairserve.sglang.config import config_from_env
from fairserve.sglang.host import PolicyHost

VOCAB = 50_000
MAX_CONTEXT = 4096
FLOAT16 = importlib.import_module("torch").float16
"""The KV pool's dtype (torch comes with SGLang; imported by name, so the main environment's
type check, which has no torch, reads it as ``Any``)."""
OUTPUT_TOKEN = 7
"""Every token the stand-in model produces (never an end of sequence: requests finish by
length, but SGLang reserves only ``new_token_ratio`` of their outputs, as for real ones)."""


@dataclass
class Offer:
    """One ``PrefillAdder.add_one_req`` call of the admission loop, as SGLang saw it."""

    rid: str
    result: Any
    admitted: bool
    extend: int
    """Tokens SGLang computes for it (after its real prefix match); 0 when not admitted."""


@dataclass
class Prefill:
    """One admission loop: the waiting queue's matches, the offers, the admissions."""

    matched: dict[str, int]
    """rid → SGLang's prefix match at ``calc_priority`` (what the policy is told)."""
    offers: list[Offer] = field(default_factory=list)

    @property
    def admitted(self) -> list[str]:
        return [o.rid for o in self.offers if o.admitted]


@dataclass
class Step:
    """What one iteration did: its admission loop (None: a decode step), retractions."""

    step: int
    prefill: Prefill | None
    retracted: list[str]
    results: list[tuple[str, int, bool]] | None
    """After the forward (None: no batch ran): (rid, output tokens so far, finished) of
    every request in the batch."""


def set_policy(
    policy: str | None,
    quantum: float | None = None,
    extension: bool = False,
    admin_token: str | None = None,
    **params: Any,
) -> None:
    """Configure the loaded plugin for the next :class:`Engine`, from the environment
    variables the launcher sets (None: the plugin does nothing, as without
    ``FAIRSERVE_POLICY``); ``extension``: serve the worker extension on a free port of
    127.0.0.1 (writes need ``admin_token`` when one is given)."""
    reset_plugin()
    if policy is None:
        return
    env = {"FAIRSERVE_POLICY": policy}
    if quantum is not None:
        env["FAIRSERVE_QUANTUM"] = f"{quantum:g}"
    if params:
        env["FAIRSERVE_POLICY_PARAMS"] = json.dumps(params)
    if extension:
        env["FAIRSERVE_EXTENSION_PORT"] = "0"
    if admin_token is not None:
        env["FAIRSERVE_ADMIN_TOKEN"] = admin_token
    config = config_from_env(env)
    assert config is not None
    hooks.activate(config)


def reset_plugin() -> None:
    """No host, no configuration, no extension server: as a process before the plugin."""
    server = hooks.PLUGIN.server
    if server is not None:
        server.stop()
    hooks.PLUGIN.server = None
    hooks.PLUGIN.server_failed = False
    hooks.PLUGIN.config = None
    hooks.PLUGIN.scheduler = None
    hooks.install_host(None)


class Engine:
    """One SGLang scheduler (one rank) on the CPU."""

    def __init__(
        self,
        kv_tokens: int,
        max_running: int = 32,
        max_prefill_tokens: int = 8192,
        server_args: dict[str, Any] | None = None,
        new_token_ratio: float = 0.7,
    ) -> None:
        """``new_token_ratio``: the share of ``max_new_tokens`` the adder reserves for a
        request's outputs (SGLang's ``NewTokenRatioTracker``: raised by a retraction, then
        lowered step by step back to this floor; a low one over-admits, and the decode steps
        retract)."""
        args = ServerArgs(model_path="dummy", device="cpu", **(server_args or {}))
        set_global_server_args_for_scheduler(args)
        self.req_pool = ReqToTokenPool(
            size=max_running + 8, max_context_len=MAX_CONTEXT, device="cpu",
            enable_memory_saver=False,
        )  # fmt: skip
        kv_pool = MHATokenToKVPool(
            size=kv_tokens, page_size=1, dtype=FLOAT16, head_num=1, head_dim=4,
            layer_num=1, device="cpu", enable_memory_saver=False,
        )  # fmt: skip
        self.allocator = TokenToKVPoolAllocator(
            size=kv_tokens, dtype=FLOAT16, device="cpu", kvcache=kv_pool, need_sort=False
        )
        self.cache = UnifiedRadixCache(
            CacheInitParams(
                disable=False, req_to_token_pool=self.req_pool,
                token_to_kv_pool_allocator=self.allocator, page_size=1,
                tree_components=(ComponentType.FULL,),
            )
        )  # fmt: skip
        self.policy = SchedulePolicy("lpm", self.cache, False, False, False)
        self.max_running = max_running
        self.max_prefill_tokens = max_prefill_tokens
        self.model_config = SimpleNamespace(
            vocab_size=VOCAB, is_encoder_decoder=False, hf_text_config=SimpleNamespace()
        )
        self.running = ScheduleBatch(reqs=[], batch_is_full=False)
        self.last_prefill: ScheduleBatch | None = None
        self.ratio = NewTokenRatioTracker(
            init=new_token_ratio, min=new_token_ratio, decay=0.02, current=new_token_ratio
        )
        self.steps = 0
        self.inputs: list[Any] = []
        """Messages for the next iteration's ``process_input_requests``."""
        self.scheduler = _scheduler_without_model(self)
        hooks.scheduler_ready(None, self.scheduler, args, None)  # Scheduler.__init__'s hook

    @property
    def host(self) -> PolicyHost | None:
        return hooks.PLUGIN.host

    @property
    def waiting_queue(self) -> list[Req]:
        queue: list[Req] = self.scheduler.waiting_queue
        return queue

    # ------------------------------------------------------------ requests
    def add(self, rid: str, tokens: Iterable[int], max_new: int, client: str | None) -> Req:
        """A tokenized request arrives (``Scheduler._add_request_to_queue``)."""
        sampling = SamplingParams(max_new_tokens=max_new)
        sampling.normalize(None)
        req = Req(
            rid, "", array("q", tokens), sampling, routing_key=client, vocab_size=VOCAB,
            eos_token_ids=set(),
        )  # fmt: skip
        self.scheduler._add_request_to_queue(req)
        return req

    # ------------------------------------------------------------ one iteration
    def step(self) -> Step:
        """One iteration of SGLang's event loop."""
        aborts = self.scheduler._poll_timeout_aborts()  # the leader; broadcast to all ranks
        inputs, self.inputs = [*aborts, *self.inputs], []
        self.scheduler.process_input_requests(inputs)
        self._merge_last_prefill()
        prefill = self._prefill()
        retracted: list[str] = []
        if prefill is not None and prefill.admitted:
            batch = self._extend_batch(prefill)
            self.last_prefill = batch
        else:
            batch, retracted = self._decode_batch()
        results = None
        if batch is not None:
            self.scheduler.process_batch_result(batch, SimpleNamespace(kind="stand-in"))
            results = [(str(r.rid), len(r.output_ids), bool(r.finished())) for r in batch.reqs]
        self.steps += 1
        return Step(self.steps - 1, prefill, retracted, results)

    def _merge_last_prefill(self) -> None:
        last, self.last_prefill = self.last_prefill, None
        if last is None:
            return
        last.filter_batch()
        if last.is_empty():
            return
        if self.running.is_empty():
            self.running = last
        else:
            self.running.merge_batch(last)

    def _prefill(self) -> Prefill | None:
        """``Scheduler._get_new_batch_prefill_raw`` up to the new batch."""
        queue = self.waiting_queue
        if not queue:
            return None
        running = self.running
        if running.is_empty():
            running.batch_is_full = False
        if running.batch_is_full:
            return None
        self.policy.calc_priority(queue, running, processed_tokens=0)
        record = Prefill({str(r.rid): int(r.prefix_len) for r in queue})
        adder = PrefillAdder(
            1, self.cache, self.allocator, running, self.ratio.current,
            self.max_prefill_tokens, None, 0, 0, max_prefill_bs=0,
            max_running_requests=self.max_running, waiting_queue_len=len(queue),
        )  # fmt: skip
        for req in queue:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            if len(adder.can_run_list) + len(running.reqs) >= self.max_running:
                running.batch_is_full = True
                break
            req.init_next_round_input(self.cache)
            result = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
            admitted = bool(adder.can_run_list) and adder.can_run_list[-1] is req
            extend = len(req.full_untruncated_fill_ids) - int(req.prefix_len) if admitted else 0
            record.offers.append(Offer(str(req.rid), result, admitted, extend))
            if result != AddReqResult.CONTINUE:
                if result == AddReqResult.NO_TOKEN:
                    running.batch_is_full = bool(adder.can_run_list) or not running.is_empty()
                break
        self._admitted = adder.can_run_list
        chosen = set(map(id, adder.can_run_list))
        self.scheduler.waiting_queue = [r for r in queue if id(r) not in chosen]
        return record

    def _extend_batch(self, prefill: Prefill) -> ScheduleBatch:
        batch = ScheduleBatch.init_new(
            list(self._admitted), self.req_pool, self.allocator, self.cache,
            self.model_config, False, SpeculativeAlgorithm.NONE,
        )  # fmt: skip
        batch.prepare_for_extend()
        return batch

    def _decode_batch(self) -> tuple[ScheduleBatch | None, list[str]]:
        """``Scheduler.update_running_batch``: retract when the KV pool cannot hold the next
        token of every running request, then ``prepare_for_decode``."""
        batch = self.running
        batch.filter_batch()
        if batch.is_empty():
            batch.batch_is_full = False
            return None, []
        retracted: list[str] = []
        if not batch.check_decode_mem():
            reqs, self.ratio.current, _aborts = batch.retract_decode()
            for req in reqs:
                retracted.append(str(req.rid))
                self.scheduler._add_request_to_queue(req, is_retracted=True)
            batch.batch_is_full = False
        else:
            self.ratio.decay_step()
        batch.prepare_for_decode()
        return batch, retracted

    # ------------------------------------------------------------ helpers
    def run(self, steps: int) -> list[Step]:
        return [self.step() for _ in range(steps)]

    def idle(self) -> bool:
        return not self.waiting_queue and self.running.is_empty() and self.last_prefill is None


# ---------------------------------------------------------------- SGLang's Scheduler, no model
def _scheduler_without_model(engine: Engine) -> Any:
    """A ``Scheduler`` whose hooked methods (``_add_request_to_queue``,
    ``_poll_timeout_aborts``, ``process_input_requests``, ``process_batch_result``) are
    SGLang's own; the attributes they read are set here, and the parts that would talk to
    the model, the tokenizer process or metrics are the stand-ins below."""
    sched = Scheduler.__new__(Scheduler)
    attributes: dict[str, Any] = {
        "waiting_queue": [],
        "tree_cache": engine.cache,
        "server_args": SimpleNamespace(served_model_name="cpu-tier", model_path="dummy"),
        "max_total_num_tokens": engine.allocator.size,
        "enable_priority_scheduling": False,
        "abort_on_priority_when_disabled": False,
        "schedule_low_priority_values_first": False,
        "disaggregation_mode": DisaggregationMode.NULL,
        "max_queued_requests": None,
        "enable_hicache_storage": False,
        "enable_lmcache": False,
        "processed_tokens_counter": 0,
        "session_controller": _Quiet(),
        "flush_wrapper": _Quiet(),
        "external_corpus_manager": None,
        "rust_server": None,
        "result_queue": [],
        "enable_fpm": False,
        "scheduler_stage_metrics": None,
        "load_publisher": _Quiet(),
        "load_inquirer": _Quiet(),
        "metrics_reporter": _Quiet(),
        "batch_result_processor": _ModelStandIn(engine),
        "publish_load_snapshot": lambda force=False: None,
        "_record_step_counters": lambda batch, result: None,
        "_maybe_clear_mm_inputs": lambda batch: None,
        "maybe_send_health_check_signal": lambda: None,
        "_collect_inflight_batches": lambda: [engine.running, engine.last_prefill],
    }
    for name, value in attributes.items():
        setattr(sched, name, value)
    return sched


class _Quiet:
    """SGLang's collaborators that only publish or log (metrics, load, sessions)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class _ModelStandIn:
    """What the model and SGLang's result processor do with a finished forward: one token
    per request (``OUTPUT_TOKEN``), its finish state, the KV released or checkpointed into
    the radix cache (SGLang's ``release_kv_cache`` / ``checkpoint_kv_cache``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def process_batch_result_prefill(self, batch: ScheduleBatch, result: Any) -> None:
        for req in batch.reqs:
            req.output_ids.append(OUTPUT_TOKEN)
            req.update_finish_state()
            if req.finished():
                release_kv_cache(req, self.engine.cache, checkpoint=True)
            else:
                checkpoint_kv_cache(req, self.engine.cache)

    def process_batch_result_decode(self, batch: ScheduleBatch, result: Any) -> None:
        for req in batch.reqs:
            if req.finished():
                continue
            req.output_ids.append(OUTPUT_TOKEN)
            req.update_finish_state(1)
            if req.finished():
                release_kv_cache(req, self.engine.cache, checkpoint=True)


def environment_for_plugin(policy: str) -> dict[str, str]:
    """The environment ``fairserve launch --engine sglang`` gives SGLang's processes."""
    return {
        "SGLANG_PLUGINS": "fairserve",
        "FAIRSERVE_POLICY": policy,
        "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": os.environ.get(
            "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python"
        ),
    }
