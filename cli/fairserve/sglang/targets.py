"""Everything the plugin relies on inside SGLang, in one list (the plugin *and* its test).

The plugin registers one hook per :data:`HOOKS` entry, and the contract test parses the
pinned SGLang wheel (``ast``, no import) and checks every entry: the hooked method exists
with these leading parameters, the classes have the attributes the adapters read, the enum
members and launch flags exist. An SGLang upgrade that moves any of them fails that test
loudly instead of silently running without fairness.

Why each hook (the ``why`` field) is part of the contract too: it says which event of the
scheduling core (DESIGN §2) the hook feeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SGLANG_VERSION = "0.5.23"
"""The SGLang release the hooks are written against (``fairserve[sglang]`` pins it)."""

PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "fairserve"
PLUGIN_OBJECT = "fairserve.sglang.plugin:register"
"""The entry point: ``[project.entry-points."sglang.srt.plugins"] fairserve = ...``."""

HookKind = Literal["before", "after", "around"]


@dataclass(frozen=True, slots=True)
class HookTarget:
    """One method of SGLang the plugin wraps with ``HookRegistry.register``."""

    module: str
    qualname: str
    params: tuple[str, ...]
    """The leading parameters, ``self`` included, in order, as the hook receives them."""
    kind: HookKind
    handler: str
    """The function in :mod:`fairserve.sglang.hooks` registered on it."""
    why: str

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.qualname}"


SCHEDULER = "sglang.srt.managers.scheduler"
POLICY = "sglang.srt.managers.schedule_policy"
EVENTS = "sglang.srt.mem_cache.events"

HOOKS: tuple[HookTarget, ...] = (
    HookTarget(
        SCHEDULER, "Scheduler.__init__", ("self", "server_args", "port_args"), "after",
        "scheduler_ready", "build the policy once the KV capacity is known",
    ),
    HookTarget(
        SCHEDULER, "Scheduler._add_request_to_queue", ("self", "req", "is_retracted"), "after",
        "request_queued", "arrival (or a retraction back to the waiting queue)",
    ),
    HookTarget(
        POLICY, "SchedulePolicy.calc_priority",
        ("self", "waiting_queue", "running_batch", "processed_tokens"), "after",
        "order_waiting", "start of a batching decision: the policy's order of candidates",
    ),
    HookTarget(
        POLICY, "PrefillAdder.add_one_req",
        ("self", "req", "has_chunked_req", "truncation_align_size"), "around",
        "admit_one", "admission with skip; the extend charge from the real prefix match",
    ),
    HookTarget(
        SCHEDULER, "Scheduler.process_batch_result", ("self", "batch", "result"), "after",
        "batch_done", "decode charges per produced token, finish and abort",
    ),
    HookTarget(
        SCHEDULER, "Scheduler._poll_timeout_aborts", ("self",), "after",
        "leader_poll", "the leader rank: start the extension, send quantum changes to all ranks",
    ),
    HookTarget(
        SCHEDULER, "Scheduler.process_input_requests", ("self", "recv_reqs"), "before",
        "apply_controls", "every rank applies quantum changes in the same iteration",
    ),
    HookTarget(
        EVENTS, "KVCacheEventRecorder.record_remove", ("self", "node", "medium"), "before",
        "node_evicted", "prefix-cache evictions for the router's global tree",
    ),
    HookTarget(
        EVENTS, "KVCacheEventRecorder.record_all_cleared", ("self",), "before",
        "cache_cleared", "a flushed cache forgets every prefix",
    ),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ClassContract:
    """Attributes (assigned as ``self.name`` or defined in the class body) the adapters read."""

    module: str
    cls: str
    attributes: tuple[str, ...]


CLASSES: tuple[ClassContract, ...] = (
    ClassContract(
        "sglang.srt.managers.schedule_batch", "Req",
        ("rid", "routing_key", "origin_input_ids", "output_ids", "full_untruncated_fill_ids",
         "prefix_len", "sampling_params", "finished_reason", "finished"),
    ),
    ClassContract("sglang.srt.managers.schedule_batch", "ScheduleBatch", ("reqs", "launch_ts")),
    ClassContract(POLICY, "PrefillAdder", ("can_run_list", "budget_state")),
    ClassContract(
        SCHEDULER, "Scheduler",
        ("max_total_num_tokens", "server_args", "waiting_queue", "tree_cache"),
    ),
    ClassContract("sglang.srt.mem_cache.radix_cache", "RadixCache", ("kv_events",)),
    ClassContract("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache", ("tree_core",)),
    ClassContract(
        "sglang.srt.mem_cache.unified_cache.unified_tree_core", "UnifiedTreeCore", ("kv_events",)
    ),
    ClassContract("sglang.srt.sampling.sampling_params", "SamplingParams", ("max_new_tokens",)),
    ClassContract("sglang.srt.mem_cache.radix_cache", "TreeNode", ("parent", "key")),
    ClassContract(
        "sglang.srt.mem_cache.unified_cache.unified_tree_core", "UnifiedTreeNode",
        ("parent", "key"),
    ),
    ClassContract(
        "sglang.srt.mem_cache.radix_cache", "RadixKey",
        ("token_ids", "child_key_at", "match_at", "page_aligned"),
    ),
    ClassContract(POLICY, "SchedulePolicy", ("tree_cache",)),
    ClassContract(
        "sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache",
        ("tree_core", "disable", "linker"),
    ),
    ClassContract(
        "sglang.srt.mem_cache.unified_cache.unified_tree_core", "UnifiedTreeCore",
        ("root_node", "page_size", "enable_hicache", "is_eagle", "components", "_node_arena"),
    ),
    ClassContract(
        "sglang.srt.mem_cache.unified_cache.unified_tree_core", "UnifiedTreeNode",
        ("children", "parent", "key", "id", "evicted", "backuped"),
    ),
    ClassContract(
        "sglang.srt.mem_cache.unified_cache.components.full", "FullComponent", ()
    ),
    ClassContract(
        "sglang.srt.managers.schedule_batch", "Req", ("extra_key", "cache_salt", "session")
    ),
    ClassContract(
        "sglang.srt.plugins.hook_registry", "HookRegistry", ("register", "apply_hooks")
    ),
)  # fmt: skip

ENUMS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (POLICY, "AddReqResult", ("CONTINUE", "NO_TOKEN", "OTHER")),
    ("sglang.srt.plugins.hook_registry", "HookType", ("BEFORE", "AFTER", "AROUND")),
)
"""(module, enum class, members the plugin uses)."""

FINISH_ABORT = ("sglang.srt.managers.schedule_batch", "FINISH_ABORT")
"""The finish reason of an aborted request (matched by class name, never imported)."""

REGISTER_PARAMS = ("cls", "target", "hook", "hook_type")
"""``HookRegistry.register``'s leading parameters, as the plugin calls it."""

TREE_CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"
TREE_CORE_BACKEND = "python"
"""SGLang's default radix tree core is written in Rust and reports removed nodes only as
hashed KV events; the Python tree core calls ``KVCacheEventRecorder.record_remove`` with
the node, which is how the plugin learns evicted prefixes. So the plugin selects it."""
ENVIRON_MODULE = "sglang.srt.environ"
TREE_CORE_REGISTRY = "sglang.srt.mem_cache.unified_cache.tree_core_registry"

LAUNCH_MODULE = "sglang.launch_server"
SERVER_FIELDS_PACKAGE = "sglang.srt.arg_groups.fields"
LAUNCH_FIELDS = ("model_path", "host", "port", "tp_size", "enable_metrics", "schedule_policy")
"""``ServerArgs`` fields whose flags ``fairserve launch --engine sglang`` passes to
``python -m sglang.launch_server``; SGLang derives each flag from the field name."""


def launch_flag(field: str) -> str:
    """SGLang's flag for a ``ServerArgs`` field (``tp_size`` → ``--tp-size``)."""
    return "--" + field.replace("_", "-")
