"""``decode_whole`` (the router's one-call JSON decoding) gives exactly what the decoder's own
``decode`` gives: the same value, or the same exception with the same message."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core.json_body import _DECODER, decode_whole

_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_NOISE = st.sampled_from(["", " ", "\n", "\t ", ",", "}", "]", "x", "\ufeff", "NaN", '"'])


def _outcome(decoder: json.JSONDecoder, text: str, fast: bool) -> tuple[str, Any]:
    try:
        value = decode_whole(decoder, text) if fast else decoder.decode(text)
    except Exception as exc:  # the type and the message must be the same
        return type(exc).__name__, str(exc)
    return "value", json.dumps(value, sort_keys=True)  # NaN-safe, order-insensitive compare


@settings(max_examples=400)
@given(value=_VALUES, before=_NOISE, after=_NOISE, cut=st.integers(0, 40))
def test_same_value_or_same_error_as_decode(value: Any, before: str, after: str, cut: int) -> None:
    whole = json.dumps(value)
    for text in (whole, before + whole + after, whole[: max(0, len(whole) - cut)]):
        for decoder in (_DECODER, json.JSONDecoder()):
            assert _outcome(decoder, text, True) == _outcome(decoder, text, False), text


@pytest.mark.parametrize(
    "text",
    ['{"a": NaN}', '{"a": 1} x', " {}", "{} ", "", "[" * 100_000, '{"a": "\\ud800"}', '{"a":1}{}'],
)
def test_edge_cases(text: str) -> None:
    for decoder in (_DECODER, json.JSONDecoder()):
        assert _outcome(decoder, text, True) == _outcome(decoder, text, False)
