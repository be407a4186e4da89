"""Fakes shaped like the SGLang objects the plugin touches, and a loop that drives them.

Only the fields listed in ``fairserve.sglang.targets`` exist here, with SGLang's names and
types (``array('q')`` token ids, ``prefix_len`` set by prefix matching, an ``AddReqResult``
enum, ``can_run_list``, ``budget_state()``); the contract test checks that the real classes
still have them. :class:`FakeScheduler` reproduces the *shape* of SGLang's admission loop
(order the queue, offer each request to ``add_one_req``, stop on anything but CONTINUE,
drop the admitted from the queue) so the hooks run in the order SGLang runs them.
"""

from __future__ import annotations

import time
import types
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, ClassVar

from fairserve.core.radix import RadixTree
from fairserve.core.types import tokens_to_key
from fairserve.sglang import hooks


class AddReqResult(Enum):
    CONTINUE = auto()
    NO_TOKEN = auto()
    OTHER = auto()


@dataclass
class SamplingParams:
    max_new_tokens: int | None = 16


class FINISH_LENGTH:
    pass


class FINISH_ABORT:
    pass


class Req:
    """SGLang's ``Req`` as far as the plugin reads it."""

    def __init__(
        self, rid: str, tokens: list[int], max_new_tokens: int, routing_key: str | None = None
    ) -> None:
        self.rid = rid
        self.routing_key = routing_key
        self.origin_input_ids = array("q", tokens)
        self.output_ids = array("q")
        self.full_untruncated_fill_ids = array("q")
        self.prefix_len = 0
        self.extend_end: int | None = None
        self.sampling_params = SamplingParams(max_new_tokens)
        self.finished_reason: object | None = None
        self.host_hit = 0
        """Tokens a host-memory cache would load back at admission (HiCache)."""

    def finished(self) -> bool:
        return self.finished_reason is not None

    def init_next_round_input(self, cache: FakeCache) -> None:
        self.full_untruncated_fill_ids = self.origin_input_ids + self.output_ids
        self.prefix_len = cache.match(self.full_untruncated_fill_ids)

    @property
    def remaining_new_tokens(self) -> int:
        return max(0, (self.sampling_params.max_new_tokens or 0) - len(self.output_ids))


class FakeCache:
    """The device prefix cache: a core radix tree over token ids."""

    def __init__(self) -> None:
        self.tree = RadixTree()

    def match(self, tokens: Any) -> int:
        return self.tree.match_len(tokens_to_key(list(tokens)))

    def insert(self, tokens: Any) -> None:
        self.tree.insert(tokens_to_key(list(tokens)))


class Budget:
    """A token budget for one decision (prefill tokens plus reserved output tokens).

    Used by :class:`PrefillAdder` and by the reference ``can_fit`` of the tests, so both
    sides of a comparison answer by the same rule."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def take(self, extend_tokens: int, reserve_tokens: int) -> bool:
        need = extend_tokens + reserve_tokens
        if need > self.tokens:
            return False
        self.tokens -= need
        return True


class PrefillAdder:
    """SGLang's ``PrefillAdder`` reduced to a token budget."""

    def __init__(self, budget_tokens: int) -> None:
        self.budget = Budget(budget_tokens)
        self.can_run_list: list[Req] = []

    def add_one_req(
        self, req: Req, has_chunked_req: bool = False, truncation_align_size: int | None = None
    ) -> AddReqResult:
        if self.budget_state() is not AddReqResult.CONTINUE:
            return self.budget_state()
        extend = len(req.full_untruncated_fill_ids) - req.prefix_len - req.host_hit
        if not self.budget.take(extend, req.remaining_new_tokens):
            return AddReqResult.NO_TOKEN
        req.prefix_len += req.host_hit
        req.extend_end = len(req.full_untruncated_fill_ids)
        self.can_run_list.append(req)
        return self.budget_state()

    def budget_state(self) -> AddReqResult:
        return AddReqResult.CONTINUE if self.budget.tokens > 0 else AddReqResult.NO_TOKEN


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    launch_ts: float | None = None
    """``time.monotonic()`` when the step was launched."""


class SchedulePolicy:
    """SGLang's ``SchedulePolicy`` with its LPM order: match every request, longest first."""

    def __init__(self, cache: FakeCache) -> None:
        self.cache = cache

    def calc_priority(
        self, waiting_queue: list[Req], running_batch: Any = None, processed_tokens: int = 0
    ) -> None:
        for req in waiting_queue:
            req.init_next_round_input(self.cache)
        waiting_queue.sort(key=lambda r: -r.prefix_len)


AddOneReq = Callable[..., AddReqResult]


def reserved_tokens(req: Req) -> int:
    return len(req.origin_input_ids) + (req.sampling_params.max_new_tokens or 0)


@dataclass
class LoopRecord:
    """What one admission loop did: each offered request and the answer it got."""

    offered: list[tuple[str, AddReqResult]] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)


class Scheduler:
    """``sglang.srt.managers.scheduler.Scheduler``: only the hooked methods, doing the
    least that SGLang does in them. Unhooked they schedule nothing fair at all."""

    def __init__(self, server_args: Any = None, port_args: Any = None) -> None:
        self.server_args = server_args
        self.max_total_num_tokens = 0
        self.waiting_queue: list[Req] = []
        self.inputs: list[Any] = []

    def _add_request_to_queue(self, req: Req, is_retracted: bool = False) -> None:
        self.waiting_queue.append(req)

    def process_batch_result(self, batch: ScheduleBatch, result: Any) -> None:
        pass

    def _poll_timeout_aborts(self) -> list[Any]:
        return []

    def process_input_requests(self, recv_reqs: list[Any]) -> None:
        self.inputs.extend(recv_reqs)


class KVCacheEventRecorder:
    """``sglang.srt.mem_cache.events.KVCacheEventRecorder`` with events disabled."""

    def record_remove(self, node: Any, medium: Any = None) -> None:
        pass

    def record_all_cleared(self) -> None:
        pass


FAKE_CLASSES: dict[str, type] = {
    "sglang.srt.managers.scheduler.Scheduler": Scheduler,
    "sglang.srt.managers.schedule_policy.SchedulePolicy": SchedulePolicy,
    "sglang.srt.managers.schedule_policy.PrefillAdder": PrefillAdder,
    "sglang.srt.mem_cache.events.KVCacheEventRecorder": KVCacheEventRecorder,
}
"""Every class ``fairserve.sglang.targets.HOOKS`` names, by its dotted SGLang path."""


class FakeScheduler(Scheduler):
    """A scheduler loop shaped like SGLang's, calling the (hooked) SGLang-named methods:
    queue, ``calc_priority``, the admission loop over ``add_one_req``, batch results."""

    def __init__(self, kv_tokens: int, passes_over: Callable[[Req], bool] | None = None):
        super().__init__()
        self.cache = FakeCache()
        self.policy = SchedulePolicy(self.cache)
        self.running: list[Req] = []
        self.kv_tokens = kv_tokens
        """KV memory: a decision's budget is what the running requests do not reserve."""
        self.passes_over = passes_over or (lambda req: False)
        """Requests the loop skips on its own (SGLang: LoRA slots, storage prefetch)."""

    def add_request(self, req: Req) -> None:
        self._add_request_to_queue(req)

    def prefill(self, budget_tokens: int | None = None) -> LoopRecord:
        """``calc_priority`` then the admission loop."""
        record = LoopRecord()
        if not self.waiting_queue:
            return record
        self.policy.calc_priority(self.waiting_queue, None, processed_tokens=0)
        adder = PrefillAdder(self.free_tokens() if budget_tokens is None else budget_tokens)
        for req in self.waiting_queue:
            if adder.budget_state() is AddReqResult.OTHER:
                break
            if self.passes_over(req):
                continue
            req.init_next_round_input(self.cache)
            result = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
            record.offered.append((req.rid, result))
            if result is not AddReqResult.CONTINUE:
                break
        admitted = set(map(id, adder.can_run_list))
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
        for req in adder.can_run_list:
            self.cache.insert(req.full_untruncated_fill_ids)
        self.running.extend(adder.can_run_list)
        record.admitted = [r.rid for r in adder.can_run_list]
        return record

    def free_tokens(self) -> int:
        """KV tokens not reserved by running requests (prompt plus every output token)."""
        return self.kv_tokens - sum(reserved_tokens(r) for r in self.running)

    def forward(self, targets: dict[str, int]) -> list[str]:
        """Every running request produces one token; those reaching ``targets[rid]``
        finish. Then ``process_batch_result``; returns the finished rids."""
        finished = []
        batch = ScheduleBatch(list(self.running), time.monotonic())
        for req in self.running:
            req.output_ids.append(7)
            if len(req.output_ids) >= targets[req.rid]:
                req.finished_reason = FINISH_LENGTH()
                finished.append(req.rid)
        self.process_batch_result(batch, object())
        self.running = [r for r in self.running if not r.finished()]
        return finished

    def iteration_inputs(self) -> list[Any]:
        """The start of an event-loop iteration on the leader: aborts (and whatever the
        plugin adds) go out with the received requests, and are processed."""
        received = self._poll_timeout_aborts()
        self.process_input_requests(received)
        return received

    def abort_waiting(self, rid: str) -> None:
        self.waiting_queue = [r for r in self.waiting_queue if r.rid != rid]

    def abort_running(self, rid: str) -> None:
        for req in self.running:
            if req.rid == rid:
                req.finished_reason = FINISH_ABORT()


Patch = Callable[[type, str, Callable[..., Any]], None]


def apply_hooks_locally(patch: Patch) -> None:
    """Wrap the fake classes' methods with ``fairserve.sglang.hooks`` the way SGLang's
    ``HookRegistry`` documents each HookType (AFTER: ``hook(result, *args)``, a non-None
    return replaces the result; BEFORE: ``hook(*args)`` may return new ``(args, kwargs)``;
    AROUND: ``hook(original, *args)``). ``patch`` is ``monkeypatch.setattr``. The test with
    the wheel applies them with SGLang's own registry instead."""
    from fairserve.sglang.targets import HOOKS

    for target in HOOKS:
        cls = FAKE_CLASSES[target.dotted.rsplit(".", 1)[0]]
        name = target.qualname.split(".")[1]
        patch(cls, name, _wrap(getattr(cls, name), getattr(hooks, target.handler), target.kind))


def _wrap(original: Callable[..., Any], hook: Callable[..., Any], kind: str) -> Callable[..., Any]:
    def after(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        replaced = hook(result, *args, **kwargs)
        return result if replaced is None else replaced

    def before(*args: Any, **kwargs: Any) -> Any:
        changed = hook(*args, **kwargs)
        if changed is not None:
            args, kwargs = changed
        return original(*args, **kwargs)

    def around(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    return {"after": after, "before": before, "around": around}[kind]


# ---------------------------------------------------------------- TreeNode / RadixKey
class RadixKey:
    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = array("q", token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)


class TreeNode:
    def __init__(self, tokens: list[int], parent: TreeNode | None = None) -> None:
        self.key = RadixKey(tokens)
        self.parent = parent


@dataclass(frozen=True)
class StorageMedium:
    name: str


# ---------------------------------------------------------------- a fake HookRegistry
class HookType(Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


class HookRegistry:
    """Records ``register`` calls like SGLang's registry (which applies them later)."""

    registered: ClassVar[list[tuple[str, Callable[..., Any], HookType]]] = []

    @classmethod
    def register(cls, target: str, hook: Callable[..., Any], hook_type: HookType) -> None:
        cls.registered.append((target, hook, hook_type))


def install_fake_sglang(set_module: Callable[[str, types.ModuleType], None]) -> type[HookRegistry]:
    """Provide fake ``sglang.srt.plugins.hook_registry`` and ``schedule_policy`` modules
    through ``set_module`` (``monkeypatch.setitem`` on ``sys.modules``, so they go away after
    the test); returns the registry class."""
    HookRegistry.registered = []
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins", "sglang.srt.managers"):
        set_module(name, types.ModuleType(name))
    registry = types.ModuleType("sglang.srt.plugins.hook_registry")
    registry.HookRegistry = HookRegistry  # type: ignore[attr-defined]
    registry.HookType = HookType  # type: ignore[attr-defined]
    set_module(registry.__name__, registry)
    policy = types.ModuleType("sglang.srt.managers.schedule_policy")
    policy.AddReqResult = AddReqResult  # type: ignore[attr-defined]
    set_module(policy.__name__, policy)
    return HookRegistry
