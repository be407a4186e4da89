"""How calls become request bodies: shared id prefixes stay shared on the wire, and quoted
answers replace the planned ones exactly where the workload put them."""

from __future__ import annotations

from fairserve.bench.prompts import (
    Answer,
    Segment,
    ancestors,
    chat_messages,
    generate_ids,
    key_text,
    request_body,
    segments,
)
from fairserve.core.tokenizer import tokenize
from fairserve.core.types import tokens_to_key
from fairserve.workloads.model import Call, Program


def key(*ids: int) -> bytes:
    return tokens_to_key(list(ids))


def test_text_is_one_word_per_id_and_keeps_prefixes() -> None:
    shared, a, b = key(1, 2, 3), key(4, 5), key(6, 7, 8)
    assert key_text(shared + a).startswith(key_text(shared))
    assert key_text(shared + b).startswith(key_text(shared))
    assert key_text(shared + a) != key_text(shared + b)
    # The simulated worker tokenises it back to one token per id, with equal prefixes.
    assert len(tokenize(key_text(shared + a))) == 5
    assert tokenize(key_text(shared + a))[:3] == tokenize(key_text(shared + b))[:3]


def test_segments_swap_each_ancestors_planned_answer_for_the_real_one() -> None:
    planned_0, planned_1 = key(100, 101), key(200, 201, 202)
    call = Call("p/c2", key(1, 2) + planned_0 + key(3) + planned_1 + key(4), 5, 5)
    first, second = Answer(" x y"), Answer(" z", (9,))
    parts = segments(call, [(planned_0, first), (planned_1, second)])
    assert parts == [
        Segment(key(1, 2)),
        Segment(planned_0, first),
        Segment(key(3)),
        Segment(planned_1, second),
        Segment(key(4)),
    ]
    # generate: real ids where the server said them, planned ids where it did not
    assert generate_ids(parts) == [1, 2, 100, 101, 3, 9, 4]


def test_segments_ignore_matches_that_are_not_token_aligned() -> None:
    planned = b"\x01\x00\x00\x00"
    prompt = b"\x00\x01\x00\x00" + b"\x00\x00\x00\x00"  # bytes 1..4 equal planned, unaligned
    assert segments(Call("c", prompt, 1, 1), [(planned, Answer("a"))]) == [Segment(prompt)]


def test_chat_quotes_answers_as_assistant_turns() -> None:
    parts = [Segment(key(1, 2)), Segment(key(7), Answer("ans wer")), Segment(key(3))]
    messages = chat_messages(parts)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[0]["content"] == key_text(key(1, 2)).lstrip()
    assert messages[1]["content"] == "ans wer"


def test_bodies_ask_for_the_planned_length_and_stream() -> None:
    parts = [Segment(key(1, 2, 3))]
    native = request_body("generate", parts, 7)
    assert native["input_ids"] == [1, 2, 3]
    assert native["sampling_params"] == {"max_new_tokens": 7, "ignore_eos": True}
    for api in ("completions", "chat"):
        body = request_body(api, parts, 7)
        assert body["max_tokens"] == 7 and body["ignore_eos"] and body["stream"]
        assert body["stream_options"] == {"include_usage": True}
    assert request_body("completions", parts, 7)["prompt"] == key_text(key(1, 2, 3))


def test_ancestors_are_transitive_and_in_program_order() -> None:
    calls = (
        Call("p/c0", key(1), 1, 1),
        Call("p/c1", key(2), 1, 1, after=("p/c0",)),
        Call("p/c2", key(3), 1, 1, after=("p/c1",)),
        Call("p/c3", key(4), 1, 1),
    )
    found = ancestors(Program("p", "alice", "tree-of-thought", 0.0, calls))
    assert found == {"p/c0": (), "p/c1": ("p/c0",), "p/c2": ("p/c0", "p/c1"), "p/c3": ()}
