"""The router bench's CPU profile (``tests/perf/bench_router.py --profile``): which component
a frame counts for, the sampler's start/stop protocol, and the table's arithmetic."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.perf.bench_router import OTHER, Sampler, component, functions_path, profile_us


def test_frames_count_for_their_component_and_helpers_for_their_caller() -> None:
    assert component("router/pool.py:send") == "upstream socket write"
    assert component("router/front.py:answer") == "client socket write"
    assert component("core/json_body.py:parse_json") == "request JSON decode"
    assert component("core/openai_api.py:_openai_spec") == "request validation"
    assert component("sched/local/dlpm.py:_decide_one") == "fair queue (DLPM)"
    assert component("sched/dispatch/doubleq.py:_choose") == "dispatcher, cache model, trees"
    assert component("core/radix_trie.py:walk") == "dispatcher, cache model, trees"
    assert component("router/pool.py:data_received") == "answer head, framing (recv incl.)"
    assert component("router/front.py:data_received") == "request head (recv incl.)"
    assert component("router/proxy.py:_attempt") == "proxy, pool, front (glue)"
    for helper in ("sched/base.py:weight", "core/types.py:input_tokens",
                   "core/json_body.py:decode_whole"):  # fmt: skip
        assert component(helper) is None
    assert component("somewhere/else.py:f") is None


def test_the_sampler_counts_between_start_and_stop_and_writes_the_counts(tmp_path: Path) -> None:
    out = tmp_path / "samples.json"
    sampler = Sampler(out)
    sampler.counts["stale"] = 5
    sampler._start()
    try:
        deadline = time.process_time() + 0.2
        while time.process_time() < deadline:  # CPU time, outside fairserve's frames
            pass
    finally:
        sampler._stop()
    counts = json.loads(out.read_text())
    assert "stale" not in counts
    assert counts.get(OTHER, 0) >= 1


def test_profile_shares_scale_to_the_cpu_per_request() -> None:
    us = profile_us([{"a": 3, "b": 1}, {"a": 1, "b": 3}, {}], 80.0)
    assert us == {"a": 40.0, "b": 40.0}
    assert profile_us([{"a": 1}], None) == {}
    assert profile_us([{}], 80.0) == {}


def test_the_sampler_counts_the_innermost_fairserve_function(tmp_path: Path) -> None:
    """A sample counts for the innermost frame of fairserve's code (a builtin or another
    package's frame counts for its fairserve caller), or ``OTHER``."""
    from fairserve.core.json_body import parse_json

    out = tmp_path / "samples.json"
    sampler = Sampler(out)
    sampler._start()
    try:
        body = b'{"prompt": "%b"}' % (b"x" * 200_000)
        deadline = time.process_time() + 0.3
        while time.process_time() < deadline:
            parse_json(body)
    finally:
        sampler._stop()
    functions = json.loads(functions_path(out).read_text())
    decoding = functions.get("core/json_body.py:parse_json", 0)  # orjson.loads is a builtin
    assert decoding >= 1 and decoding >= sum(functions.values()) // 2, functions
