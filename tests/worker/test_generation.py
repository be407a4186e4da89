"""The generation endpoints over real HTTP: bodies, streams, usage and cache counts."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import math
import time
from typing import Any

import aiohttp

from fairserve.core.openai_api import render_chat
from fairserve.core.tokenizer import SyntheticOutput, tokenize
from tests.worker import helpers

PROMPT = "The quick brown fox jumps over the lazy dog, again and again."


def test_generate_returns_text_ids_and_meta_info() -> None:
    async def body() -> None:
        async with helpers.serving() as (_, session):
            request = {"text": PROMPT, "sampling_params": {"max_new_tokens": 6}, "rid": "g1"}
            status, out = await helpers.post_json(session, "/generate", request)
            assert status == 200
            expected = SyntheticOutput("g1", 6)
            assert out["text"] == expected.text(0, 6)
            assert out["output_ids"] == expected.token_ids()
            meta = out["meta_info"]
            assert meta["id"] == "g1"
            assert meta["prompt_tokens"] == len(tokenize(PROMPT))
            assert meta["completion_tokens"] == 6
            assert meta["cached_tokens"] == 0
            assert meta["finish_reason"] == {"type": "length", "length": 6}
            assert meta["e2e_latency"] > 0

    helpers.run(body())


def test_a_repeated_prompt_hits_the_prefix_cache() -> None:
    async def body() -> None:
        async with helpers.serving() as (_, session):
            request = {"text": PROMPT, "sampling_params": {"max_new_tokens": 2}}
            _, first = await helpers.post_json(session, "/generate", request)
            _, second = await helpers.post_json(session, "/generate", request)
            assert first["meta_info"]["cached_tokens"] == 0
            # All but the last prompt token (it is recomputed for its logits, as in SGLang).
            assert second["meta_info"]["cached_tokens"] == len(tokenize(PROMPT)) - 1

    helpers.run(body())


def test_generate_stream_sends_cumulative_text_then_done() -> None:
    async def body() -> None:
        async with helpers.serving() as (_, session):
            request: dict[str, Any] = {"input_ids": [1, 2, 3], "stream": True, "rid": "s1"}
            request["sampling_params"] = {"max_new_tokens": 4}
            async with session.post("/generate", json=request) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                events = await helpers.sse_events(resp)
            assert events[-1] == "[DONE]"
            chunks: list[dict[str, Any]] = events[:-1]
            texts = [c["text"] for c in chunks]
            assert texts[-1] == SyntheticOutput("s1", 4).text(0, 4)
            assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
            assert len(chunks) >= 2  # tokens arrive step by step
            assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
            assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])

    helpers.run(body())


def test_zero_new_tokens_returns_no_text() -> None:
    async def body() -> None:
        async with helpers.serving() as (_, session):
            status, out = await helpers.generate(session, 0, text="hi")
            assert status == 200
            assert (out["text"], out["meta_info"]["completion_tokens"]) == ("", 0)

    helpers.run(body())


def test_completions_with_usage() -> None:
    async def body() -> None:
        async with helpers.serving() as (_, session):
            request = {"model": "any", "prompt": PROMPT, "max_tokens": 5, "rid": "c1"}
            status, out = await helpers.post_json(session, "/v1/completions", request)
            assert status == 200
            assert out["object"] == "text_completion"
            assert out["model"] == "any"
            choice = out["choices"][0]
            assert choice["text"] == SyntheticOutput("c1", 5).text(0, 5)
            assert choice["finish_reason"] == "length"
            prompt = len(tokenize(PROMPT))
            assert out["usage"] == {
                "prompt_tokens": prompt,
                "completion_tokens": 5,
                "total_tokens": prompt + 5,
                "prompt_tokens_details": {"cached_tokens": 0},
            }
            _, again = await helpers.post_json(session, "/v1/completions", {**request, "rid": "c2"})
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt - 1

    helpers.run(body())


def test_completions_stream_sends_deltas_and_usage() -> None:
    async def body() -> None:
        async with helpers.serving() as (_, session):
            request = {"prompt": [9, 8, 7], "max_tokens": 3, "stream": True, "rid": "cs"}
            request["stream_options"] = {"include_usage": True}
            async with session.post("/v1/completions", json=request) as resp:
                events = await helpers.sse_events(resp)
            assert events[-1] == "[DONE]"
            usage = events[-2]
            assert usage["choices"] == []
            assert usage["usage"]["completion_tokens"] == 3
            chunks = events[:-2]
            text = "".join(c["choices"][0]["text"] for c in chunks)
            assert text == SyntheticOutput("cs", 3).text(0, 3)
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    helpers.run(body())


def test_chat_completion_and_the_next_turn_hits_the_cache() -> None:
    async def body() -> None:
        async with helpers.serving() as (_, session):
            messages = [{"role": "user", "content": "Tell me a story."}]
            request = {"messages": messages, "max_tokens": 6, "rid": "t1", "user": "carol"}
            status, out = await helpers.post_json(session, "/v1/chat/completions", request)
            assert status == 200
            assert out["object"] == "chat.completion"
            answer = out["choices"][0]["message"]
            assert answer == {
                "role": "assistant",
                "content": SyntheticOutput("t1", 6).text(0, 6)[1:],
            }
            prompt = len(tokenize(render_chat([("user", "Tell me a story.")])))
            assert out["usage"]["prompt_tokens"] == prompt
            # The next turn quotes the answer: prompt and answer come from the cache.
            turn = {**request, "rid": "t2"}
            turn["messages"] = [*messages, answer, {"role": "user", "content": "Go on."}]
            _, out2 = await helpers.post_json(session, "/v1/chat/completions", turn)
            assert out2["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt + 6
            _, state = await helpers.get_json(session, "/fairserve/worker/state")
            assert "carol" in state["policy"]["clients"]

    helpers.run(body())


def test_chat_stream_opens_with_the_role_and_ends_with_the_finish() -> None:
    async def body() -> None:
        async with helpers.serving() as (_, session):
            request = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
            request |= {"max_completion_tokens": 3, "rid": "cs1"}
            async with session.post("/v1/chat/completions", json=request) as resp:
                events = await helpers.sse_events(resp)
            assert events[-1] == "[DONE]"
            chunks = events[:-1]
            assert all(c["object"] == "chat.completion.chunk" for c in chunks)
            assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            assert chunks[-1]["choices"][0] == {
                "index": 0,
                "delta": {},
                "logprobs": None,
                "finish_reason": "length",
            }
            content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
            assert content == SyntheticOutput("cs1", 3).text(0, 3)[1:]

    helpers.run(body())


HUGE_CONTEXT_TOKENS = 8_000_000
"""A worker whose context (KV capacity) allows outputs of millions of tokens."""
PROBES = 200


def test_health_answers_within_100_ms_while_the_largest_allowed_requests_run() -> None:
    """Issue 18 item 2: a request's output is produced as it is generated, so submitting
    the largest output the context allows costs no more than a small one (it used to build
    the whole synthetic output first: ~0.4 s of a stalled event loop at 8 M tokens)."""

    async def body() -> None:
        config = helpers.make_config(profile=helpers.tiny_profile(HUGE_CONTEXT_TOKENS))
        async with helpers.serving(config) as (server, session):
            largest = HUGE_CONTEXT_TOKENS - len(tokenize(PROMPT))
            # One pause of the whole process (0.28 s once in a CI rehearsal: a collection
            # of the heap earlier tests left, or another process on two cores) says nothing
            # about the worker, while the defect stalls once per huge request: three here.
            # So the p99 is taken over 200 probes (their third largest), and objects from
            # before the probes are frozen out of the collector's scans.
            gc.collect()
            gc.freeze()
            request = {"text": PROMPT, "sampling_params": {"max_new_tokens": largest}}

            async def submit(i: int) -> None:
                await asyncio.sleep(0.1 * i)  # spread over the probing
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.post("/generate", json={**request, "rid": f"h{i}"}):
                        pass

            tasks = [asyncio.create_task(submit(i)) for i in range(3)]
            # The client shares the worker's event loop, so a probe's latency is counted
            # from when it was due: a stall between two probes delays the next one.
            latencies_s = []
            start_s = time.perf_counter()
            for k in range(PROBES):  # bounded: one every 20 ms
                due_s = start_s + 0.02 * k
                await asyncio.sleep(max(0.0, due_s - time.perf_counter()))
                status, _ = await helpers.get_json(session, "/health")
                latencies_s.append(time.perf_counter() - due_s)
                assert status == 200
            assert helpers.runtime_of(server).in_flight() >= 1, "the huge requests did not run"
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert sorted(latencies_s)[math.ceil(0.99 * len(latencies_s)) - 1] < 0.1, latencies_s

    try:
        helpers.run(body())
    finally:
        gc.unfreeze()
