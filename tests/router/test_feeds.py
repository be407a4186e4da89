"""The worker's usage, in the router's key units: a text prompt's units are estimates (4 UTF-8
bytes each) while the worker counts real tokens, so its cache hits are carried over as the
fraction of the prompt they cover; token-id prompts are counted alike on both sides."""

from __future__ import annotations

from fairserve.core.types import Request, make_request
from fairserve.router.accounting import Usage
from fairserve.router.feeds import cached_in_key_units


def _text_request(units: int) -> Request:
    return Request(id="r", client="a", prompt_key=b"word" * units, max_output_tokens=4)


def test_a_fully_cached_text_prompt_is_fully_cached_in_key_units() -> None:
    # 300 key units (1,200 bytes) that the worker counted as 220 tokens, all cached: charging
    # 300 - 220 = 80 units as computed (extend) would bill a cache hit as a partial miss.
    req = _text_request(300)
    assert cached_in_key_units(req, Usage(220, 220, 4)) == 300


def test_the_hit_fraction_carries_over_and_never_exceeds_the_prompt() -> None:
    req = _text_request(300)
    assert cached_in_key_units(req, Usage(200, 100, 4)) == 150
    assert cached_in_key_units(req, Usage(200, 0, 4)) == 0
    assert cached_in_key_units(req, Usage(0, 0, 4)) == 0  # no usage counts: nothing cached
    assert cached_in_key_units(req, Usage(100, 500, 4)) == 300


def test_token_id_prompts_are_counted_exactly() -> None:
    req = make_request("r", "a", list(range(50)), 4)
    assert cached_in_key_units(req, Usage(50, 32, 4)) == 32
