"""The long-string fast path of ``parse_json`` (``openai_api._decode_long``) gives exactly
what decoding the whole body gives: the same object, or the same 400 with the same message,
whatever the body (valid or not, escapes, control characters, quotes, surrogates, keys)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.openai_api import ApiError, _decode_long, decode_body

NEVER = 10**9
"""A threshold no string reaches: the path that decodes the whole body."""
LOW = 2
"""A threshold that short generated strings reach: the fast path is tried on most bodies."""

_TEXT = st.text(
    alphabet=st.sampled_from(['a', 'b', ' ', '"', '\\', '\n', '\x00', '\x1f', '\x7f', 'é', '€',
                              '\U0001f600', '\ud800', '/', 'u', '0']),
    max_size=30,
)  # fmt: skip
_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=10,
)
_NOISE = st.sampled_from(["", " ", "\n", ",", "}", "]", "x", '"', "\\", "\\u0000", "\x01", "\xff"])


def _outcome(raw: bytes, threshold: int) -> tuple[str, str]:
    try:
        body = decode_body(raw, threshold)
    except ApiError as exc:
        return f"error {exc.status}", exc.message
    return "body", json.dumps(body)  # order-sensitive: the same keys in the same order


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


@given(
    value=st.dictionaries(_TEXT, _VALUES, min_size=1, max_size=4),
    ascii_only=st.booleans(),
    cut=st.integers(0, 60),
    at=st.integers(0, 10_000),
    noise=_NOISE,
)
def test_same_body_or_same_error_as_the_whole_decode(
    value: dict[str, Any], ascii_only: bool, cut: int, at: int, noise: str
) -> None:
    whole = json.dumps(value, ensure_ascii=ascii_only)
    spot = at % (len(whole) + 1)
    for text in (whole, whole[: max(1, len(whole) - cut)], whole[:spot] + noise + whole[spot:]):
        raw = _raw(text)
        assert _outcome(raw, LOW) == _outcome(raw, NEVER), text


@given(
    head=st.dictionaries(_TEXT, _SCALARS, max_size=3),
    tail=st.dictionaries(_TEXT, _VALUES, max_size=3),
    long=st.text(min_size=LOW + 1, max_size=60),
    as_key=st.booleans(),
    in_chat=st.booleans(),
)
def test_a_long_string_anywhere(
    head: dict[str, Any], tail: dict[str, Any], long: str, as_key: bool, in_chat: bool
) -> None:
    """The long string as a top-level value, a chat message's content or a key."""
    value: Any = {long: 1} if as_key else long
    if in_chat:
        value = [{"role": "user", "content": value}]
    body = {**head, "prompt": value, **tail}
    raw = _raw(json.dumps(body, ensure_ascii=False))
    assert _outcome(raw, LOW) == _outcome(raw, NEVER)


def test_the_fast_path_serves_the_usual_bodies() -> None:
    """A completion, a generate and a chat body with a long plain prompt take it (and give
    the prompt back whole)."""
    prompt = "the shared service schedules every client fairly. " * 100
    bodies: list[dict[str, Any]] = [
        {"model": "m", "prompt": prompt, "max_tokens": 4},
        {"text": prompt, "sampling_params": {"max_new_tokens": 4}},
        {"model": "m", "messages": [{"role": "system", "content": prompt}], "stream": True},
    ]
    for body in bodies:
        raw = json.dumps(body).encode()
        assert _decode_long(raw, 2048) == body
        assert decode_body(raw, 2048) == body


def test_what_the_fast_path_leaves_to_the_whole_decode() -> None:
    """Escapes in or before the long string, a control character in it, a ``\\u0000``
    after it, or a long key: the whole body is decoded (None here)."""
    prompt = "x" * 3000
    for raw in (
        b'{"prompt": "a\\n' + prompt.encode() + b'"}',
        b'{"m\\n": 1, "prompt": "' + prompt.encode() + b'"}',
        b'{"prompt": "' + prompt.encode() + b'\x01"}',
        b'{"prompt": "' + prompt.encode() + b'", "x": "\\u0000"}',
        b'{"' + prompt.encode() + b'": 1}',
    ):
        assert _decode_long(raw, 2048) is None
        assert _outcome(raw, 2048) == _outcome(raw, NEVER)


@given(
    long=st.text(alphabet=st.characters(codec="utf-8"), min_size=7, max_size=40),
    byte=st.sampled_from([b"\x00", b"\x01", b"\x1f", b'"', b"\\", b"\xff", b"\xed\xa0\x80", b"\n"]),
    at=st.integers(0, 200),
)
def test_a_bad_byte_in_the_long_string(long: str, byte: bytes, at: int) -> None:
    """A raw byte that the long string may not hold as it is (a control character, a quote,
    a backslash, invalid UTF-8, an encoded surrogate) anywhere in it. Threshold 7: the
    long string is the first the fast path takes (the key ``prompt`` is shorter)."""
    raw = _raw(json.dumps({"m": "m", "prompt": long, "max_tokens": 4}, ensure_ascii=False))
    start = raw.index(b'"prompt": "') + 11
    spot = start + at % (len(raw) - start - 16)
    raw = raw[:spot] + byte + raw[spot:]
    assert _outcome(raw, 7) == _outcome(raw, NEVER), raw


def test_a_long_conversation() -> None:
    """The stand-in is searched among the first containers, earlier messages first: a long
    first message of a long chat takes the fast path; a long last one the whole decode,
    with the same result."""
    prompt = "a document to answer questions about. " * 100
    turns = [{"role": "user", "content": f"question {i}"} for i in range(200)]
    first = {"messages": [{"role": "system", "content": prompt}, *turns]}
    last = {"messages": [*turns, {"role": "user", "content": prompt}]}
    assert _decode_long(json.dumps(first).encode(), 2048) == first
    assert _decode_long(json.dumps(last).encode(), 2048) is None
    assert decode_body(json.dumps(last).encode(), 2048) == last
