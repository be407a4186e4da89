"""Request validation in ``core.openai_api``: the one place the router and the simulated
worker check a generation body. Every refusal is an :class:`ApiError` 400 whose message
names the field; nothing a client can send raises anything else (issue 18, items 2, 6, 12).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fairserve.core.json_body import MAX_JSON_DEPTH, parse_json
from fairserve.core.openai_api import (
    ApiError,
    check_context,
    parse_chat,
    parse_completion,
    parse_generate,
)

NO_HEADERS: dict[str, str] = {}


def _refused(call: Any, *args: Any) -> str:
    with pytest.raises(ApiError) as info:
        call(*args)
    assert info.value.status == 400
    return info.value.message


def _completion(**fields: Any) -> dict[str, Any]:
    return {"prompt": "hello there", **fields}


@pytest.mark.parametrize(
    "value",
    [0, -1, 10**30, 2**63, 1e20, 5.0, "5", True, [5], {"n": 5}, float("nan")],
)
def test_max_tokens_must_be_a_positive_integer_within_limits(value: object) -> None:
    message = _refused(parse_completion, _completion(max_tokens=value), NO_HEADERS)
    assert message.startswith("max_tokens: expected a positive integer")
    assert len(message) < 200  # a huge value is not echoed in full


def test_max_completion_tokens_and_max_new_tokens_are_checked_alike() -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2**63}
    assert _refused(parse_chat, chat, NO_HEADERS).startswith("max_completion_tokens: ")
    native = {"text": "hi", "sampling_params": {"max_new_tokens": -3}}
    assert _refused(parse_generate, native, NO_HEADERS).startswith(
        "sampling_params.max_new_tokens: expected a non-negative integer"
    )


def test_a_native_request_may_ask_for_no_new_tokens_as_sglang_allows() -> None:
    native = {"text": "hi", "sampling_params": {"max_new_tokens": 0}}
    assert parse_generate(native, NO_HEADERS).max_new_tokens == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.5),
        ("temperature", 2.5),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", "0.7"),
        ("top_p", 0),
        ("top_p", 1.5),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3),
        ("frequency_penalty", True),
    ],
)
def test_sampling_fields_outside_openai_ranges_are_refused(field: str, value: object) -> None:
    message = _refused(parse_completion, _completion(**{field: value}), NO_HEADERS)
    assert message.startswith(f"{field}: expected a number ")


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 0), ("temperature", 2), ("top_p", 1), ("presence_penalty", -2),
     ("frequency_penalty", 2.0), ("temperature", None), ("n", 1)],
)  # fmt: skip
def test_sampling_fields_within_ranges_are_accepted(field: str, value: object) -> None:
    parse_completion(_completion(**{field: value}), NO_HEADERS)


def test_native_sampling_params_are_checked_too() -> None:
    native = {"text": "hi", "sampling_params": {"temperature": -1}}
    assert _refused(parse_generate, native, NO_HEADERS).startswith(
        "sampling_params.temperature: expected a number "
    )
    native = {"text": "hi", "sampling_params": {"top_p": 0}}
    assert _refused(parse_generate, native, NO_HEADERS).startswith("sampling_params.top_p: ")


@pytest.mark.parametrize("n", [0, -1, 2, 1.5, "2"])
def test_n_other_than_one_is_refused_clearly(n: object) -> None:
    message = _refused(parse_completion, _completion(n=n), NO_HEADERS)
    assert message.startswith("n: ")


def test_deep_nesting_is_a_400_not_a_recursion_error() -> None:
    deep = b'{"prompt": "hi", "routing_key": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert "nested too deeply" in _refused(parse_json, deep)
    just_over = b'{"prompt": "hi", "x": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}"
    assert "nested too deeply" in _refused(parse_json, just_over)
    within = b'{"prompt": "hi", "x": ' + b"[" * 20 + b"]" * 20 + b"}"
    assert parse_json(within)["prompt"] == "hi"
    # Long bodies are walked rather than scanned for brackets: the same verdicts.
    long_prompt = b'{"prompt": "' + b"[{ " * 2000 + b'", "x": '
    just_over_long = long_prompt + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}"
    assert "nested too deeply" in _refused(parse_json, just_over_long)
    within_long = long_prompt + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    assert parse_json(within_long)["prompt"].startswith("[{ ")


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_standard_json_numbers_are_refused(literal: bytes) -> None:
    message = _refused(parse_json, b'{"prompt": "hi", "temperature": ' + literal + b"}")
    assert literal.decode() in message


def test_a_huge_integer_literal_is_a_400() -> None:
    message = _refused(parse_json, b'{"max_tokens": ' + b"9" * 5000 + b"}")
    assert message.startswith("request body is not valid JSON")


def test_lone_surrogates_are_refused_wherever_text_is_used() -> None:
    lone = "\ud800"
    cases: list[tuple[Any, dict[str, Any], str]] = [
        (parse_completion, _completion(prompt=f"a{lone}b"), "prompt"),
        (parse_chat, {"messages": [{"role": "user", "content": lone}]}, "messages[0].content"),
        (parse_chat, {"messages": [{"role": lone, "content": "x"}]}, "messages[0].role"),
        (parse_completion, _completion(routing_key=lone), "routing_key"),
        (parse_completion, _completion(user=lone), "user"),
        (parse_completion, _completion(rid=lone), "rid"),
        (parse_completion, _completion(model=lone), "model"),
        (parse_generate, {"text": lone}, "text"),
    ]
    for parse, body, field in cases:
        raw = json.dumps(body).encode()  # \ud800 escapes: valid JSON, invalid Unicode
        message = _refused(parse, parse_json(raw), NO_HEADERS)
        assert message.startswith(f"{field}: "), message
        assert "surrogate" in message


def test_the_context_check_names_the_limit_and_what_was_asked() -> None:
    # "hello there": the router does not count a text prompt's tokens (3 key units is an
    # estimate), so it refuses only what even a one-token prompt could not fit.
    spec = parse_completion(_completion(max_tokens=100), NO_HEADERS)
    check_context(spec, 101)
    check_context(spec, None)  # unknown: nothing to check
    message = _refused(check_context, spec, 100)
    assert message == (
        "This model's maximum context length is 100 tokens. However, you requested at least "
        "101 tokens (at least 1 in the prompt, 100 for the completion). Please reduce the "
        "length of the prompt or of the completion (max_tokens)."
    )
    # A worker checks with its own count of the prompt's tokens (here 2 words).
    check_context(spec, 102, prompt_tokens=2)
    assert "(2 in the prompt" in _refused(check_context, spec, 101, 2)
    # Token ids are counted exactly.
    ids = parse_completion(_completion(prompt=[1, 2], max_tokens=100), NO_HEADERS)
    check_context(ids, 102)
    assert "(2 in the prompt" in _refused(check_context, ids, 101)
