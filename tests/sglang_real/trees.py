"""SGLang's radix cache driven directly, as its scheduler drives it between two batching
steps (inserts, evictions, locks, its own matching, a reset), for ``test_matches`` and
``tests/perf/bench_sglang_plugin.py``. Imports SGLang: use it where ``require_sglang`` ran.
"""

from __future__ import annotations

import random
from array import array
from typing import Any

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import match_kv_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.sampling.sampling_params import SamplingParams

from tests.sglang_real.harness import FLOAT16, VOCAB, Engine

NAMESPACES = (None, "lora-x")
"""``extra_key`` values (LoRA adapters): each one is its own namespace in the tree."""


def make_req(rid: str, tokens: list[int], extra_key: str | None) -> Req:
    sampling = SamplingParams(max_new_tokens=4)
    sampling.normalize(None)
    return Req(
        rid, "", array("q", tokens), sampling, vocab_size=VOCAB, eos_token_ids=set(),
        extra_key=extra_key,
    )  # fmt: skip


def key_of(req: Req) -> RadixKey:
    return RadixKey(req.origin_input_ids + req.output_ids, req.extra_key, cache_salt=None)


def allocator(kv_pool: Any, kv_tokens: int, page_size: int) -> Any:
    """SGLang's token allocator, or its paged one for pages of more than one token."""
    if page_size == 1:
        return TokenToKVPoolAllocator(
            size=kv_tokens, dtype=FLOAT16, device="cpu", kvcache=kv_pool, need_sort=False
        )
    return PagedTokenToKVPoolAllocator(
        size=kv_tokens, page_size=page_size, dtype=FLOAT16, device="cpu", kvcache=kv_pool,
        need_sort=False,
    )  # fmt: skip


class Tree:
    """SGLang's ``UnifiedRadixCache`` (Python tree core) and its KV allocator (paged for
    pages of more than one token), driven by the operations its scheduler performs."""

    def __init__(self, rng: random.Random, page_size: int = 1, kv_tokens: int = 600) -> None:
        self.rng = rng
        self.page_size = page_size
        Engine(kv_tokens=8)  # SGLang's global server arguments
        kv_pool = MHATokenToKVPool(
            size=kv_tokens, page_size=page_size, dtype=FLOAT16, head_num=1, head_dim=4,
            layer_num=1, device="cpu", enable_memory_saver=False,
        )  # fmt: skip
        self.allocator = allocator(kv_pool, kv_tokens, page_size)
        req_pool = ReqToTokenPool(
            size=8, max_context_len=4096, device="cpu", enable_memory_saver=False
        )
        self.cache = UnifiedRadixCache(
            CacheInitParams(
                disable=False, req_to_token_pool=req_pool,
                token_to_kv_pool_allocator=self.allocator, page_size=page_size,
                tree_components=(ComponentType.FULL,),
            )
        )  # fmt: skip
        self.locks: list[Any] = []
        self.counts = {"insert": 0, "evict": 0, "lock": 0, "unlock": 0, "split": 0, "reset": 0}

    def insert(self, tokens: list[int], extra_key: str | None) -> None:
        tokens = tokens[: len(tokens) // self.page_size * self.page_size]
        if not tokens:
            return
        value = self.allocator.alloc(len(tokens))
        if value is None:
            self.cache.evict(EvictParams(num_tokens=len(tokens)))
            value = self.allocator.alloc(len(tokens))
            if value is None:
                return  # everything left is locked
        key = RadixKey(array("q", tokens), extra_key)
        result = self.cache.insert(InsertParams(key=key, value=value))
        self.allocator.free(value[: result.prefix_len])  # already cached: duplicates
        self.counts["insert"] += 1

    def evict(self) -> None:
        self.cache.evict(EvictParams(num_tokens=self.rng.randint(1, 120)))
        self.counts["evict"] += 1

    def lock(self, req: Req) -> None:
        result = self.cache.match_prefix(MatchPrefixParams(key=key_of(req)))
        self.locks.append(self.cache.lock(result.last_device_node))
        self.counts["lock"] += 1

    def unlock(self) -> None:
        if self.locks:
            self.cache.unlock(self.locks.pop(self.rng.randrange(len(self.locks))))
            self.counts["unlock"] += 1

    def reset(self) -> None:
        self.cache.reset()
        self.allocator.clear()
        self.locks.clear()
        self.counts["reset"] += 1

    def sglang_match(self, req: Req) -> int:
        """SGLang's own match as ``calc_priority`` runs it (it splits the node where the
        match ends and touches the path)."""
        match_kv_cache(req, self.cache, req.origin_input_ids + req.output_ids)
        self.counts["split"] += 1
        return int(req.prefix_len)

    def read_only_match(self, req: Req) -> int:
        """SGLang's read-only full-device match (no split, no touch)."""
        length, _, _ = self.cache.tree_core.match_full_device_prefix(key_of(req))
        return int(length)
