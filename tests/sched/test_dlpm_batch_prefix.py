"""DLPM's prompts admitted in one decision: the prefix a new admission shares with them is
the longest shared with any of them (a sorted list's two neighbours stand for all)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core.types import tokens_to_key
from fairserve.sched.local.dlpm import _AdmittedPrompts

keys = st.lists(st.integers(0, 3), max_size=10).map(tokens_to_key)


def shared(a: bytes, b: bytes) -> int:
    n = 0
    while n < min(len(a), len(b)) // 4 and a[4 * n : 4 * n + 4] == b[4 * n : 4 * n + 4]:
        n += 1
    return n


@settings(max_examples=300, derandomize=True, deadline=None)
@given(admitted=st.lists(keys, max_size=8), key=keys, matched=st.integers(0, 10))
def test_cached_tokens_is_the_longest_shared_prefix(
    admitted: list[bytes], key: bytes, matched: int
) -> None:
    matched = min(matched, len(key) // 4)  # a cache match never exceeds the prompt
    batch = _AdmittedPrompts()
    for other in admitted:
        batch.add(other)
    expected = max([matched] + [shared(key, other) for other in admitted])
    assert batch.cached_tokens(key, matched) == expected
