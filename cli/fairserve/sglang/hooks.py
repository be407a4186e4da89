"""The hook functions registered on SGLang (one per entry of ``targets.HOOKS``).

Each one has the calling convention of its ``HookType`` (AFTER: ``result`` first; AROUND:
the original function first; BEFORE: the original arguments, returning new ones or None)
and does nothing but hand SGLang's objects to the process's :class:`PolicyHost`. With no
host (the plugin is not configured in this process, or the scheduler is not built yet)
every hook leaves SGLang's behaviour unchanged.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fairserve.sglang.admission import AdmissionBound
from fairserve.sglang.config import PluginConfig, build_policy
from fairserve.sglang.control import PolicyChange
from fairserve.sglang.evictions import is_cache_recorder, is_device_medium, node_tokens
from fairserve.sglang.extension import ExtensionServer
from fairserve.sglang.host import PolicyHost

log = logging.getLogger("fairserve.sglang")


class _Plugin:
    """This process's plugin state: set by ``activate`` (plugin load) and the scheduler."""

    config: PluginConfig | None = None
    host: PolicyHost | None = None
    scheduler: Any = None
    """The scheduler of this process: its ``tree_cache`` is the one cache whose evictions
    the router must learn (see ``evictions.cache_recorders``)."""
    server: ExtensionServer | None = None
    server_failed: bool = False


PLUGIN = _Plugin()


def activate(config: PluginConfig) -> None:
    PLUGIN.config = config


def install_host(host: PolicyHost | None) -> None:
    """Make ``host`` this process's host (the scheduler hook; tests with fakes)."""
    PLUGIN.host = host


def make_host(config: PluginConfig, scheduler: Any, results: Any) -> PolicyHost:
    """The host for a freshly built SGLang scheduler (its KV capacity feeds Justitia)."""
    kv = getattr(scheduler, "max_total_num_tokens", None)
    capacity = int(kv) if isinstance(kv, int) and kv > 0 else None
    args = getattr(scheduler, "server_args", None)
    model = getattr(args, "served_model_name", None) or getattr(args, "model_path", None)
    policy = build_policy(config, capacity)
    return PolicyHost(
        config, policy, results, model_name=str(model) if model else None,
        kv_capacity_tokens=capacity, bound=admission_bound(),
    )  # fmt: skip


def admission_bound() -> AdmissionBound | None:
    """SGLang's admission rule as :class:`AdmissionBound` knows it (None without SGLang, or
    an SGLang whose adder or budgets moved elsewhere: every request is then offered)."""
    try:
        from sglang.srt.managers import schedule_policy
        from sglang.srt.mem_cache.prefill_budget import PrefillBudget, SWAPrefillBudget
    except ImportError:
        return None
    clip = getattr(schedule_policy, "CLIP_MAX_NEW_TOKENS", None)
    if not isinstance(clip, int):
        return None
    return AdmissionBound(clip, (schedule_policy.PrefillAdder,), (PrefillBudget, SWAPrefillBudget))


# ---------------------------------------------------------------- the hooks
def scheduler_ready(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``Scheduler.__init__``."""
    if PLUGIN.config is None:
        return
    from sglang.srt.managers.schedule_policy import AddReqResult

    install_host(make_host(PLUGIN.config, scheduler, AddReqResult))
    PLUGIN.scheduler = scheduler
    log.info("fairserve: policy %s runs in this scheduler", PLUGIN.config.policy)


def request_queued(result: Any, scheduler: Any, req: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``Scheduler._add_request_to_queue``: only a request that really entered the
    waiting queue arrives (the queue limit or a bad priority may have refused it)."""
    host = PLUGIN.host
    queue = getattr(scheduler, "waiting_queue", None)
    if host is not None and queue and queue[-1] is req:
        host.on_queued(req)


def order_waiting(result: Any, policy: Any, waiting_queue: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``SchedulePolicy.calc_priority``: the policy orders, with the matches of the
    waiting requests in the policy's prefix cache."""
    host = PLUGIN.host
    if host is not None and isinstance(waiting_queue, list):
        host.begin_decision(waiting_queue, getattr(policy, "tree_cache", None))


def admit_one(original: Any, adder: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``PrefillAdder.add_one_req``."""
    host = PLUGIN.host
    if host is None:
        return original(adder, req, *args, **kwargs)
    return host.admit(lambda: original(adder, req, *args, **kwargs), adder, req)


def batch_done(result: Any, scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``Scheduler.process_batch_result``."""
    host = PLUGIN.host
    if host is not None and batch is not None:
        launched = getattr(batch, "launch_ts", None)
        host.on_batch_result(
            list(batch.reqs), getattr(scheduler, "waiting_queue", None),
            launched if isinstance(launched, float) else None, time.monotonic(),
        )  # fmt: skip


def leader_poll(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> list[Any] | None:
    """AFTER ``Scheduler._poll_timeout_aborts`` (the leader rank only): serve the extension
    from the first iteration on, and send pending quantum changes along with the aborts,
    which SGLang broadcasts to every rank (again next time if SGLang skipped receiving)."""
    host = PLUGIN.host
    if host is None:
        return None
    _ensure_extension(host)
    messages = host.controls.pending()
    if not messages:
        return None
    return [*(result or []), *messages]


def apply_controls(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """BEFORE ``Scheduler.process_input_requests(self, recv_reqs)``: every rank takes the
    fairserve messages out of the iteration's inputs and applies them."""
    host = PLUGIN.host
    keyword = "recv_reqs" in kwargs
    reqs = kwargs["recv_reqs"] if keyword else (args[1] if len(args) > 1 else None)
    if host is None or not reqs or not any(isinstance(r, PolicyChange) for r in reqs):
        return None
    host.apply_controls([r for r in reqs if isinstance(r, PolicyChange)])
    kept = [r for r in reqs if not isinstance(r, PolicyChange)]
    if keyword:
        return args, {**kwargs, "recv_reqs": kept}
    return (args[0], kept, *args[2:]), kwargs


def node_evicted(recorder: Any, node: Any, medium: Any = None, *args: Any, **kw: Any) -> None:
    """BEFORE ``KVCacheEventRecorder.record_remove``: a prefix left the GPU cache (of the
    scheduler's own prefix cache; the hook sits on the class, for every recorder)."""
    host = PLUGIN.host
    if host is not None and is_device_medium(medium) and _own_cache(recorder):
        host.evictions.append(node_tokens(node))


def cache_cleared(recorder: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``KVCacheEventRecorder.record_all_cleared``: the whole cache is gone. Not
    when the recorder is another tree's: ``SchedulePolicy`` resets its in-batch tree of the
    waiting queue at every LPM ordering, and a flush per step would make the router forget
    every prefix this worker holds."""
    host = PLUGIN.host
    if host is not None and _own_cache(recorder):
        host.evictions.append([])


def _own_cache(recorder: Any) -> bool:
    return is_cache_recorder(getattr(PLUGIN.scheduler, "tree_cache", None), recorder)


def _ensure_extension(host: PolicyHost) -> None:
    config = PLUGIN.config
    if PLUGIN.server is not None or PLUGIN.server_failed or config is None:
        return
    if config.extension_port is None:
        return
    server = ExtensionServer(host, config.extension_host, config.extension_port, config.admin_token)
    try:
        server.start()
    except OSError as exc:
        PLUGIN.server_failed = True
        log.error(
            "fairserve: cannot serve the extension on %s:%s (%s); the policy still runs",
            config.extension_host, config.extension_port, exc,
        )  # fmt: skip
        return
    PLUGIN.server = server
