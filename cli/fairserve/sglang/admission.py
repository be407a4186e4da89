"""What the plugin knows of SGLang's admission rule without asking SGLang.

SGLang's ``PrefillAdder.add_one_req`` matches a request in its radix tree before it refuses
it for memory. With a full KV pool and a long queue, asking about every waiting request
cost ~50 µs each per decision. Where the adder and budget are SGLang's own
(:class:`AdmissionBound`), a request's least need (:func:`request_shape`, read once per
wait) against the memory left (:func:`room_left`) tells the host which requests SGLang would
refuse, so it answers for them. Other adders, budgets and request kinds get no bound: those
are offered to SGLang as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fairserve.sglang.decision import Decision


@dataclass(frozen=True)
class AdmissionBound:
    """What lets the host know, without SGLang matching a request, that
    ``PrefillAdder.add_one_req`` would answer ``NO_TOKEN`` for it.

    For the adder and memory budgets named here (SGLang's own ``PrefillAdder`` over a
    ``PrefillBudget`` or ``SWAPrefillBudget``) a request is refused when
    ``total_tokens >= rem_total_tokens``, where ``total_tokens`` is its extend (the tokens
    past its kept match, at least 1: SGLang never matches a whole prompt) plus
    ``min(max_new_tokens - outputs, clip_max_new_tokens)`` plus the adder's
    ``per_req_token_overhead`` plus reserves that are never negative; ``rem_total_tokens``
    read outside the adder's lock on the request's prefix can only be larger than inside
    it. Other adders or budgets (shared SWA pools that chunk on a shortfall, diffusion
    models, Mamba state slots) get no bound."""

    clip_max_new_tokens: int
    """SGLang's ``CLIP_MAX_NEW_TOKENS`` (the output reservation's cap)."""
    adders: tuple[type, ...]
    budgets: tuple[type, ...]


Shape = tuple[int, int, bool]
"""(prompt and output tokens SGLang matches, output tokens it reserves, ignores EOS)."""


def request_shape(sreq: Any, clip_max_new_tokens: int) -> Shape | None:
    """What a waiting request's least need is made of: KV tokens SGLang's ``add_one_req``
    charges it at least, besides the adder's ``per_req_token_overhead``, are its extend and
    its output reservation. The extend is the tokens past its kept match
    (:mod:`fairserve.sglang.matches`: SGLang's own match in its tree, which does not change
    during the admission loop), at least one (a prompt is never matched whole); requests
    without a kept match (a cache of another shape: HiCache, SWA, Mamba, the Rust tree
    core) are not skipped. None where the host does not skip the request: beam search and
    LoRA requests (the loop's own checks before ``add_one_req`` depend on them), no
    prompt."""
    if getattr(sreq, "beam_group", None) is not None or getattr(sreq, "lora_id", None) is not None:
        return None
    sampling = sreq.sampling_params
    max_new = getattr(sampling, "max_new_tokens", None)
    prompt = getattr(sreq, "origin_input_ids", None)
    if not isinstance(max_new, int) or not prompt:
        return None
    outputs = len(sreq.output_ids)
    reserved = min(max(max_new - outputs, 0), clip_max_new_tokens)
    return len(prompt) + outputs, reserved, bool(getattr(sampling, "ignore_eos", False))


def room_left(bound: AdmissionBound | None, decision: Decision, adder: Any) -> float | None:
    """The least need (:func:`request_shape`) from which SGLang's ``add_one_req`` refuses
    a request now; None where its rule is not the one :class:`AdmissionBound` knows."""
    if (
        bound is None
        or not decision.needs
        or type(adder) not in bound.adders
        or type(getattr(adder, "memory_budget", None)) not in bound.budgets
        or getattr(adder, "dllm_config", None) is not None
        or bool(getattr(adder, "_mamba_slot_cost", 0))
        or getattr(adder, "rem_mamba_slots", None) is not None
        or getattr(adder, "is_hybrid_ssm_cache", False)
        or getattr(getattr(adder.tree_cache, "req_to_token_pool", None), "mamba_allocator", None)
        is not None  # requests may hold Mamba state (see holds_mamba)
    ):
        return None
    if decision.ignores_eos and getattr(adder.tree_cache, "disable", True):
        return None  # SGLang's add_one_req_ignore_eos has rules of its own
    return float(adder.rem_total_tokens) - float(adder.per_req_token_overhead)


def holds_mamba(sreq: Any) -> bool:
    """Hybrid (Mamba) models stage per-request state before admission that SGLang releases
    only when its loop stops at the request: never skip past such a request."""
    return bool(getattr(getattr(sreq, "kv", None), "holds_mamba", False))
