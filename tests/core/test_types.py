"""Token keys, requests and clients: the values every policy trusts without re-checking."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core.errors import ConfigError
from fairserve.core.types import (
    TOKEN_BYTES,
    Client,
    Request,
    key_len,
    key_to_tokens,
    make_request,
    tokens_to_key,
    validate_weight,
)

token_ids = st.lists(st.integers(0, 2**32 - 1), max_size=50)


@settings(max_examples=80, derandomize=True, deadline=None)
@given(tokens=token_ids, other=token_ids)
def test_token_key_round_trip_and_prefix_order(tokens: list[int], other: list[int]) -> None:
    key = tokens_to_key(tokens)
    assert key_to_tokens(key) == tokens
    assert key_len(key) == len(tokens) == len(key) // TOKEN_BYTES
    # Byte prefixes on token boundaries are exactly token prefixes (what the radix tree uses).
    joined = tokens_to_key(tokens + other)
    assert joined.startswith(key) and joined[: len(key)] == key
    assert tokens_to_key(other).startswith(key) == (other[: len(tokens)] == tokens)


@pytest.mark.parametrize("bad", [[-1], [2**32], [0, 2**40]])
def test_token_ids_outside_uint32_are_config_errors(bad: list[int]) -> None:
    with pytest.raises(ConfigError, match="token ids"):
        tokens_to_key(bad)


@pytest.mark.parametrize("length", [1, 2, 3, 5, 7])
def test_key_of_partial_token_is_rejected(length: int) -> None:
    with pytest.raises(ConfigError, match="multiple of 4"):
        key_to_tokens(b"\x00" * length)


def test_request_fields_and_derived_counts() -> None:
    req = make_request("r1", "alice", [1, 2, 3, 4, 5], max_output_tokens=64, arrival_s=2.5)
    assert (req.id, req.client, req.arrival_s, req.input_tokens) == ("r1", "alice", 2.5, 5)
    assert req.expected_output_tokens == 64  # live hosts know only the maximum
    req.cached_tokens = 3
    assert req.extend_tokens == 2
    req.cached_tokens = 9  # cached more than the prompt (shared longer prefix): nothing to do
    assert req.extend_tokens == 0
    sim = make_request("r2", "bob", [1], max_output_tokens=64, output_len=7, app="chat-1")
    assert (sim.expected_output_tokens, sim.app) == (7, "chat-1")
    assert sim.meta == {} and sim.meta is not req.meta


def test_requests_have_identity_semantics() -> None:
    a = make_request("same", "c", [1, 2], 8)
    b = make_request("same", "c", [1, 2], 8)
    assert a != b and a == a
    assert len({a, b}) == 2 and {a: 1}[a] == 1


@pytest.mark.parametrize("max_output_tokens", [-1, -100])
def test_request_rejects_negative_max_output(max_output_tokens: int) -> None:
    with pytest.raises(ConfigError, match=r"r9.*max_output_tokens"):
        make_request("r9", "c", [1], max_output_tokens)


def test_request_rejects_partial_token_key() -> None:
    with pytest.raises(ConfigError, match="whole number of tokens"):
        Request(id="r", client="c", prompt_key=b"\x00\x00\x00", max_output_tokens=1)


def test_client_weights() -> None:
    assert Client("alice").weight == 1.0
    assert Client("bob", 2.5).weight == 2.5
    validate_weight("carol", 1e-9)


@pytest.mark.parametrize("weight", [0.0, -1.0, math.nan, math.inf, -math.inf])
def test_bad_client_weights_are_config_errors(weight: float) -> None:
    with pytest.raises(ConfigError, match="'mallory'"):
        Client("mallory", weight)
    with pytest.raises(ConfigError, match="positive"):
        validate_weight("mallory", weight)
