"""``parse_json`` reads bodies with orjson where it can (issue 23: the request's JSON decoding
is the router's largest cost on long prompts), yet answers exactly as the standard library's
path (``parse_json_stdlib``, kept as the reference): the same value, with the same types,
key order and float bits, or the same :class:`ApiError` (status and message).

Bodies of :data:`ORJSON_MIN_BYTES` or more are orjson's to read, so every case is also
padded with whitespace to that length. orjson refuses what the standard library takes (lone
surrogate escapes, UTF-8-encoded surrogates, a byte order mark, UTF-16/32, floats beyond the
double range) and reads integers beyond 64 bits as floats: each must still get the standard
library's answer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core.json_body import MAX_JSON_DEPTH, ORJSON_MIN_BYTES, parse_json, parse_json_stdlib
from fairserve.core.openai_api import ApiError

PROPERTY = settings(max_examples=300, derandomize=True, deadline=None)


def _typed(value: Any) -> Any:
    """``value`` with every type, key order and float's bits spelled out (``==`` alone
    takes ``1 == 1.0 == True``, ``0.0 == -0.0`` and dicts in any order as equal)."""
    if isinstance(value, dict):
        return ("dict", tuple((type(k).__name__, k, _typed(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", tuple(_typed(v) for v in value))
    if isinstance(value, float):
        return ("float", value.hex())
    return (type(value).__name__, value)


def _outcome(parse: Any, raw: bytes) -> tuple[Any, ...]:
    try:
        body = parse(raw)
    except ApiError as error:
        return ("error", error.status, error.message, error.code)
    return ("value", _typed(body))


_PAD = b" " * ORJSON_MIN_BYTES
"""JSON whitespace that makes a body long enough for orjson (:data:`ORJSON_MIN_BYTES`)."""


def _same(raw: bytes) -> None:
    """The same answer for ``raw`` and, read by orjson, for ``raw`` padded with whitespace
    after it and before it (which also takes the standard library's sniffing of the
    encoding, :func:`json.detect_encoding`)."""
    for body in (raw, raw + _PAD, _PAD + raw):
        assert _outcome(parse_json, body) == _outcome(parse_json_stdlib, body), body[:200]


_BOUNDARY_INTS = st.sampled_from(
    [0, -1, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30]
)
_INTS = st.integers() | _BOUNDARY_INTS | st.integers(-(10**320), 10**320)
_TEXT = st.text(st.characters(exclude_categories=()), max_size=12)  # surrogates included
_SCALARS = st.none() | st.booleans() | _INTS | st.floats() | _TEXT
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=16,
)
_ENCODINGS = st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-8-sig", "utf-16-le", "utf-32"])


def _serialised(value: Any, ensure_ascii: bool, encoding: str, top: bool) -> bytes:
    body = value if top else {"prompt": "hi", "x": value}
    text = json.dumps(body, ensure_ascii=ensure_ascii)  # NaN and Infinity as literals
    return text.encode(encoding, "surrogatepass")


@PROPERTY
@given(value=_VALUES, ensure_ascii=st.booleans(), encoding=_ENCODINGS, top=st.booleans())
def test_the_same_value_or_error_as_the_standard_library(
    value: Any, ensure_ascii: bool, encoding: str, top: bool
) -> None:
    _same(_serialised(value, ensure_ascii, encoding, top))


@PROPERTY
@given(
    value=_VALUES,
    ensure_ascii=st.booleans(),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.binary(max_size=3), st.integers(0, 3))),
)
def test_mutated_bodies_get_the_same_answer(
    value: Any, ensure_ascii: bool, edits: list[tuple[int, bytes, int]]
) -> None:
    raw = bytearray(_serialised(value, ensure_ascii, "utf-8", False))
    for at, insert, delete in edits:  # splice: delete a few bytes, insert a few
        where = at % (len(raw) + 1)
        raw[where : where + delete] = insert
    _same(bytes(raw))


@PROPERTY
@given(raw=st.binary(max_size=64))
def test_arbitrary_bytes_get_the_same_answer(raw: bytes) -> None:
    _same(raw)
    _same(b'{"a": ' + raw + b"}")


@pytest.mark.parametrize(
    "raw",
    [
        *(b'{"n": %d}' % n for n in (2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 10**30)),
        b'{"n": [1, {"m": 123456789012345678901234567890}]}',
        b'{"n": ' + b"9" * 400 + b"}",
        b'{"n": ' + b"9" * 5000 + b"}",
        b'{"n": 1e400}',
        b'{"n": -1e400}',
        b'{"n": 1.7976931348623159e308}',
        b'{"n": 1e19}',
        b'{"n": -0}',
        b'{"n": -0.0}',
        b'{"n": 5e-324}',
        b'{"n": 2.4703282292062327e-324}',
        b'{"a": 1, "b": 2, "a": 3}',
        b'{"a": {"x": 1}, "a": [2]}',
        b'{"a": NaN}',
        b'{"a": -Infinity}',
        b'{"a": "\\ud800"}',
        b'{"a": "\\udc00\\ud800"}',
        b'{"\\ud800": 1}',
        b'{"a": "\xed\xa0\x80"}',
        b'\xef\xbb\xbf{"a": 1}',
        '{"a": 1}'.encode("utf-16"),
        b' {"a": 1} ',
        b'{"a": 1} x',
        b'{"a": [1,]}',
        b'{"a": "\x1f"}',
        b'{"a": "\x7f\xc3\xa9"}',
        b'{"a": "\xff"}',
        b'{"a": "\xc0\xaf"}',
        b"[1, 2]",
        b'"text"',
        b"",
        b"\x00",
    ],
)
def test_edge_cases(raw: bytes) -> None:
    _same(raw)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, 1000, 1023, 1024, 5000])
def test_nesting_is_judged_alike(depth: int) -> None:
    for prompt in (b"hi", b"[{ " * 2000):
        _same(b'{"prompt": "' + prompt + b'", "x": ' + b"[" * depth + b"]" * depth + b"}")
        _same(b'{"x": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}")


def test_a_long_prompt_is_read_as_the_standard_library_reads_it() -> None:
    prompt = "fair " * 3000 + "caf\u00e9 \U0001f600"
    raw = json.dumps({"prompt": prompt, "max_tokens": 4, "temperature": 0.7}).encode()
    body = parse_json(raw)
    assert body == {"prompt": prompt, "max_tokens": 4, "temperature": 0.7}
    _same(raw)
