"""Request bodies to generation specs: what is accepted, and what each refusal says."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.json_body import parse_json
from fairserve.core.openai_api import (
    MAX_TOKEN_ID,
    ApiError,
    parse_chat,
    parse_completion,
    parse_generate,
    render_chat,
)
from fairserve.core.prefix_key import text_key

NO_HEADERS: dict[str, str] = {}


def refusal(parse: Any, body: dict[str, Any]) -> str:
    with pytest.raises(ApiError) as info:
        parse(body, NO_HEADERS)
    assert info.value.status == 400
    return info.value.message


def test_generate_from_text_with_defaults() -> None:
    spec = parse_generate({"text": "Hello world"}, NO_HEADERS)
    assert (spec.prompt_text, spec.prompt_key) == ("Hello world", text_key("Hello world"))
    assert spec.prompt_tokens == 3  # 11 bytes: three 4-byte units
    assert (spec.max_new_tokens, spec.stream, spec.client) == (128, False, "anonymous")
    assert len(spec.rid) == 32


def test_generate_from_input_ids_with_everything_set() -> None:
    body = {
        "input_ids": [5, 6, 7],
        "sampling_params": {"max_new_tokens": 9, "ignore_eos": True, "temperature": 0.7},
        "stream": True,
        "rid": "r-1",
        "routing_key": "alice",
        "model": None,
        "log_metrics": True,
    }
    spec = parse_generate(body, {"X-Fairserve-App": "app-7"})
    assert (spec.prompt_ids, spec.max_new_tokens, spec.stream) == ([5, 6, 7], 9, True)
    assert (spec.prompt_text, spec.prompt_tokens) == (None, 3)
    assert (spec.rid, spec.client, spec.app) == ("r-1", "alice", "app-7")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "'text' or 'input_ids' is required"),
        ({"text": "a", "input_ids": [1]}, "not both"),
        ({"text": ["a", "b"]}, "batched requests are not supported"),
        ({"input_ids": [[1], [2]]}, "batched requests are not supported"),
        ({"text": "a", "rid": ["x", "y"]}, "batched requests are not supported"),
        ({"text": 5}, "text: expected a string, got a number"),
        ({"text": ""}, "text: the prompt is empty"),
        ({"input_ids": []}, "input_ids: expected a non-empty list"),
        ({"input_ids": [1, -2]}, "input_ids[1]: expected a token id"),
        ({"input_ids": [1, True]}, "input_ids[1]: expected a token id"),
        ({"input_ids": [1, 2, 2**32]}, "input_ids[2]: expected a token id"),
        ({"input_ids": [0, 1.0]}, "input_ids[1]: expected a token id (an integer in"),
        ({"input_ids": [None, 3]}, "input_ids[0]: expected a token id"),
        ({"text": "a", "sampling_params": []}, "sampling_params: expected a JSON object"),
        (
            {"text": "a", "sampling_params": {"max_new_tokens": -1}},
            "sampling_params.max_new_tokens: expected a non-negative integer, got -1",
        ),
        (
            {"text": "a", "sampling_params": {"max_new_tokens": "8"}},
            "sampling_params.max_new_tokens: expected a non-negative integer, got '8'",
        ),
        ({"text": "a", "sampling_params": {"ignore_eos": "yes"}}, "ignore_eos: expected true"),
        ({"text": "a", "stream": 1}, "stream: expected true or false"),
        ({"text": "a", "rid": ""}, "rid: expected a non-empty string"),
        ({"text": "a", "routing_key": 3}, "routing_key: expected a non-empty string"),
    ],
)
def test_generate_refusals_say_what_is_wrong(body: dict[str, Any], message: str) -> None:
    assert message in refusal(parse_generate, body)


@given(st.lists(st.one_of(st.integers(-3, 2**32 + 3), st.booleans(), st.floats(0, 9)), max_size=40))
def test_token_ids_are_accepted_exactly_when_each_is_an_integer_id(ids: list[Any]) -> None:
    """The check runs in C for lists that pass; its verdict and the id it names must be
    those of checking one id at a time."""
    bad = [
        i
        for i, t in enumerate(ids)
        if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID  # bool is not int
    ]
    if ids and not bad:
        assert parse_generate({"input_ids": ids}, NO_HEADERS).prompt_ids == ids
    elif ids:
        assert f"input_ids[{bad[0]}]: expected a token id" in refusal(
            parse_generate, {"input_ids": ids}
        )


def test_completion_prompt_as_text_ids_or_a_batch_of_one() -> None:
    assert parse_completion({"prompt": "a b"}, NO_HEADERS).prompt_text == "a b"
    assert parse_completion({"prompt": "a b"}, NO_HEADERS).prompt_key == text_key("a b")
    assert parse_completion({"prompt": [3, 4]}, NO_HEADERS).prompt_ids == [3, 4]
    assert parse_completion({"prompt": [3, 4]}, NO_HEADERS).prompt_text is None
    assert parse_completion({"prompt": ["a b"]}, NO_HEADERS).prompt_key == text_key("a b")
    spec = parse_completion({"prompt": "x"}, NO_HEADERS)
    assert spec.max_new_tokens == 16  # the OpenAI default for completions


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "missing field: 'prompt'"),
        ({"prompt": ["a", "b"]}, "batched requests are not supported"),
        ({"prompt": [[1], [2]]}, "batched requests are not supported"),
        ({"prompt": "a", "max_tokens": -3}, "max_tokens: expected a positive integer"),
        ({"prompt": "a", "n": 2}, "n: only n = 1 is supported"),
        ({"prompt": "a", "user": 7}, "user: expected a string"),
        ({"prompt": "a", "model": 7}, "model: expected a string"),
        ({"prompt": "a", "stream_options": 1}, "stream_options: expected a JSON object"),
    ],
)
def test_completion_refusals(body: dict[str, Any], message: str) -> None:
    assert message in refusal(parse_completion, body)


def test_chat_renders_messages_with_the_fixed_template() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"text": "!"}]},
        ],
        "max_completion_tokens": 7,
        "max_tokens": 99,
        "user": "bob",
        "stream_options": {"include_usage": True},
    }
    spec = parse_chat(body, NO_HEADERS)
    assert spec.prompt_text == "<|system|> Be brief.\n<|user|> Hi!\n<|assistant|>"
    assert spec.prompt_text == render_chat([("system", "Be brief."), ("user", "Hi!")])
    assert spec.prompt_key == text_key(spec.prompt_text)
    assert (spec.max_new_tokens, spec.client, spec.include_usage) == (7, "bob", True)
    assert parse_chat({"messages": [{"role": "user"}]}, NO_HEADERS).max_new_tokens == 128


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "missing field: 'messages'"),
        ({"messages": []}, "messages: expected a non-empty list"),
        ({"messages": ["hi"]}, "messages[0]: expected an object"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role: expected a non-empty string"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content: expected"),
        ({"messages": [{"role": "user", "content": [3]}]}, "messages[0].content[0]"),
    ],
)
def test_chat_refusals(body: dict[str, Any], message: str) -> None:
    assert message in refusal(parse_chat, body)


def test_client_identity_precedence() -> None:
    header = {"X-Fairserve-Client": "from-header"}
    both = {"prompt": "a", "routing_key": "rk", "user": "u"}
    assert parse_completion(both, header).client == "rk"
    assert parse_completion({"prompt": "a", "user": "u"}, header).client == "from-header"
    assert parse_completion({"prompt": "a", "user": "u"}, NO_HEADERS).client == "u"
    assert parse_completion({"prompt": "a"}, NO_HEADERS).client == "anonymous"


@pytest.mark.parametrize(
    ("raw", "message"),
    [(b"{nope", "not valid JSON"), (b"[1]", "expected a JSON object, got a list")],
)
def test_bodies_must_be_json_objects(raw: bytes, message: str) -> None:
    with pytest.raises(ApiError, match=message):
        parse_json(raw)
