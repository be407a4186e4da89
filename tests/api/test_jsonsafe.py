"""The one rule for non-finite floats on the wire (``fairserve.api.jsonsafe``)."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from fairserve.api.jsonsafe import dumps, json_safe
from fairserve.tui.parse import as_float


def test_infinities_are_strings_and_nan_is_null() -> None:
    value = {"q": math.inf, "low": -math.inf, "p99": math.nan, 3: (1.5, [math.inf])}
    assert json_safe(value) == {
        "q": "inf",
        "low": "-inf",
        "p99": None,
        "3": [1.5, ["inf"]],
    }
    assert json.loads(dumps(value))["q"] == "inf"


def test_the_readers_turn_the_strings_back_into_floats() -> None:
    assert as_float(json.loads(dumps(math.inf))) == math.inf
    assert as_float(json.loads(dumps(-math.inf))) == -math.inf


JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=20,
)


@given(VALUES)
def test_any_value_becomes_strict_json(value: object) -> None:
    text = dumps(value)  # allow_nan=False: raises on anything non-finite left
    json.loads(text)
