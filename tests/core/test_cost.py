"""Cost models: the numbers the papers define, and per-event charges that add up to the
whole-request cost (a host only ever reports events, reports only ever read totals)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core.cost import (
    CostModel,
    KVTokenTimeCost,
    PiecewiseLinearBatchTime,
    TimeCost,
    WeightedTokenCost,
    kv_token_time,
)
from fairserve.core.errors import ConfigError
from fairserve.core.types import Request, make_request

PROPERTY = settings(max_examples=80, derandomize=True, deadline=None)
BAD_NUMBERS = [-1.0, -1e-9, math.nan, math.inf]


def request(prompt_tokens: int, cached_tokens: int = 0) -> Request:
    req = make_request("r", "c", [7] * prompt_tokens, max_output_tokens=1000)
    req.cached_tokens = cached_tokens
    return req


def charged_by_events(cost: CostModel, prompt: int, cached: int, decoded: int) -> float:
    """Admission plus one decode charge per produced token, the way hosts report them."""
    req = request(prompt, cached)
    total = cost.admit_cost(req, req.extend_tokens)
    for _ in range(decoded):
        req.output_tokens += 1  # hosts count the token, then ask for its charge
        total += cost.decode_cost(req)
    return total


# --------------------------------------------------------------------------- token cost
def test_weighted_token_cost_defaults_are_dlpm_paper_values() -> None:
    cost = WeightedTokenCost()
    assert (cost.w_e, cost.w_q, cost.name) == (1.0, 2.0, "tokens")
    assert cost.admit_cost(request(100, 30), 70) == 70
    assert cost.decode_cost(request(100)) == 2
    assert cost.request_cost(100, 30, 5) == 70 + 2 * 5
    assert cost.request_cost(10, 50, 5) == 10  # cache larger than the prompt: no extend


def test_max_request_cost_is_the_bound_term_u() -> None:
    """U = w_e·L_input + w_q·M (DLPM Thm 4.1)."""
    assert WeightedTokenCost().max_request_cost(4096, 256) == 4096 + 2 * 256
    assert WeightedTokenCost(w_e=0.5, w_q=3).max_request_cost(100, 10) == 50 + 30


@pytest.mark.parametrize("field", ["w_e", "w_q"])
@pytest.mark.parametrize("bad", BAD_NUMBERS)
def test_weighted_token_cost_rejects_bad_weights(field: str, bad: float) -> None:
    with pytest.raises(ConfigError, match=field):
        WeightedTokenCost(**{field: bad})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- KV token-time
def test_kv_token_time_numbers() -> None:
    assert kv_token_time(0, 0) == 0
    assert kv_token_time(10, 1) == 11
    assert kv_token_time(100, 4) == 100 * 4 + 1 + 2 + 3 + 4
    cost = KVTokenTimeCost()
    assert cost.admit_cost(request(100), 100) == 0  # memory-centric: prefill holds nothing yet
    assert cost.name == "kv-token-time"


@PROPERTY
@given(prompt=st.integers(0, 5000), decoded=st.integers(0, 300))
def test_kv_step_charges_sum_to_token_time(prompt: int, decoded: int) -> None:
    """The i-th output token is charged p + i; over d tokens that is p·d + d(d+1)/2."""
    steps = [float(prompt + i) for i in range(1, decoded + 1)]
    expected = prompt * decoded + decoded * (decoded + 1) / 2
    assert kv_token_time(prompt, decoded) == sum(steps) == expected
    assert charged_by_events(KVTokenTimeCost(), prompt, 0, decoded) == expected
    assert KVTokenTimeCost().request_cost(prompt, 0, decoded) == expected


# --------------------------------------------------------------------------- batch time
def test_piecewise_linear_batch_time_numbers() -> None:
    model = PiecewiseLinearBatchTime(c_s=0.02, a_s_per_token=1e-4, b0_tokens=256)
    assert model.batch_time_s(1, 0) == model.batch_time_s(256, 0) == 0.02  # flat below b0
    assert model.batch_time_s(1256, 0) == pytest.approx(0.02 + 0.1)  # slope a above b0
    assert model.capacity_tokens_per_s(2256) == pytest.approx(2256 / 0.22)
    full = PiecewiseLinearBatchTime(
        0.02, 1e-4, 256, attention_s_per_token=1e-7, step_overhead_s=0.003
    )
    assert full.batch_time_s(1256, 10_000) == pytest.approx(0.003 + 0.12 + 1e-3)
    assert full.capacity_tokens_per_s(1256) == pytest.approx(1256 / 0.123)


@PROPERTY
@given(
    c_s=st.floats(0, 1),
    a_s=st.floats(0, 1e-3),
    b0=st.integers(0, 4096),
    low=st.integers(0, 8192),
    extra=st.integers(0, 8192),
)
def test_batch_time_is_flat_then_linear(
    c_s: float, a_s: float, b0: int, low: int, extra: int
) -> None:
    model = PiecewiseLinearBatchTime(c_s=c_s, a_s_per_token=a_s, b0_tokens=b0)
    high = low + extra
    assert model.batch_time_s(high, 0) >= model.batch_time_s(low, 0)
    if high <= b0:
        assert model.batch_time_s(high, 0) == c_s
    if low >= b0:
        gained = model.batch_time_s(high, 0) - model.batch_time_s(low, 0)
        assert gained == pytest.approx(a_s * extra, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    "field", ["c_s", "a_s_per_token", "attention_s_per_token", "step_overhead_s"]
)
@pytest.mark.parametrize("bad", BAD_NUMBERS)
def test_batch_time_rejects_bad_coefficients(field: str, bad: float) -> None:
    params: dict[str, float] = {"c_s": 0.01, "a_s_per_token": 1e-4, "b0_tokens": 128, field: bad}
    with pytest.raises(ConfigError, match=field):
        PiecewiseLinearBatchTime(**params)  # type: ignore[arg-type]


def test_batch_time_rejects_negative_b0_and_bad_capacity_queries() -> None:
    with pytest.raises(ConfigError, match="b0_tokens"):
        PiecewiseLinearBatchTime(0.01, 1e-4, -1)
    with pytest.raises(ConfigError, match="max_token_load"):
        PiecewiseLinearBatchTime(0.01, 1e-4, 128).capacity_tokens_per_s(0)
    with pytest.raises(ConfigError, match="batch time is zero"):
        PiecewiseLinearBatchTime(0.0, 0.0, 128).capacity_tokens_per_s(512)


# --------------------------------------------------------------------------- time cost
MODEL = PiecewiseLinearBatchTime(c_s=0.02, a_s_per_token=1e-4, b0_tokens=256)


def test_time_cost_prices_tokens_at_the_reference_load() -> None:
    cost = TimeCost(MODEL, reference_load_tokens=2256)
    assert cost.token_s == pytest.approx(0.22 / 2256)
    assert cost.admit_cost(request(100), 100) == pytest.approx(100 * 0.22 / 2256)
    assert cost.decode_cost(request(100)) == pytest.approx(0.22 / 2256)  # no attention term
    assert cost.name == "time"


def test_time_cost_charges_attention_over_context() -> None:
    model = PiecewiseLinearBatchTime(0.02, 1e-4, 256, attention_s_per_token=1e-6)
    cost = TimeCost(model, reference_load_tokens=2256)
    req = request(1000, cached_tokens=400)
    assert cost.admit_cost(req, 600) == pytest.approx(cost.token_s * 600 + 400e-6)
    req.output_tokens = 5
    assert cost.decode_cost(req) == pytest.approx(cost.token_s + 1005e-6)


@pytest.mark.parametrize("ref", [0, -5])
def test_time_cost_rejects_non_positive_reference_load(ref: int) -> None:
    with pytest.raises(ConfigError, match="reference_load_tokens"):
        TimeCost(MODEL, reference_load_tokens=ref)


# --------------------------------------------------------------------------- consistency
COSTS: list[CostModel] = [
    WeightedTokenCost(),
    WeightedTokenCost(w_e=0.5, w_q=3.0),
    KVTokenTimeCost(),
    TimeCost(PiecewiseLinearBatchTime(0.02, 1e-4, 256, 1e-7, 0.001), reference_load_tokens=1024),
]


@PROPERTY
@given(
    which=st.integers(0, len(COSTS) - 1),
    prompt=st.integers(0, 2000),
    cached_share=st.floats(0, 1),
    decoded=st.integers(0, 200),
)
def test_event_charges_add_up_to_request_cost(
    which: int, prompt: int, cached_share: float, decoded: int
) -> None:
    cost = COSTS[which]
    cached = int(prompt * cached_share)
    expected = cost.request_cost(prompt, cached, decoded)
    assert charged_by_events(cost, prompt, cached, decoded) == pytest.approx(expected, rel=1e-9)
    assert isinstance(cost, CostModel)


@PROPERTY
@given(
    which=st.integers(0, len(COSTS) - 1),
    prompt=st.integers(0, 2000),
    before=st.integers(0, 200),
    steps=st.integers(1, 50),
)
def test_decode_span_cost_equals_the_per_token_charges(
    which: int, prompt: int, before: int, steps: int
) -> None:
    """Fused decode (the simulator) charges exactly what step-by-step decode would."""
    cost = COSTS[which]
    req = make_request("r", "c", [1] * prompt, before + steps)
    one_by_one = 0.0
    for i in range(1, steps + 1):
        req.output_tokens = before + i
        one_by_one += cost.decode_cost(req)
    assert cost.decode_span_cost(req, steps) == pytest.approx(one_by_one, rel=1e-9)
