"""The batch-time fit on synthetic measurements with known coefficients."""

from __future__ import annotations

import random

import pytest

from fairserve.core.cost import PiecewiseLinearBatchTime
from fairserve.core.errors import ConfigError
from fairserve.profiling.fit import fit_observations
from fairserve.profiling.observations import (
    Observation,
    decode_window,
    mixed_window,
    prefill,
)

TRUTH = PiecewiseLinearBatchTime(
    c_s=0.008, a_s_per_token=3e-5, b0_tokens=200, attention_s_per_token=2e-7
)
LOADS = (8, 16, 32, 64, 128, 192, 256, 384, 512, 1024, 2048, 4096)


def _decode(running: int, prompt: int, outputs: int, steps: int, noise: float = 0.0) -> Observation:
    total = sum(
        TRUTH.batch_time_s(running, running * prompt + outputs + running * s) for s in range(steps)
    )
    return decode_window(running, prompt, outputs, steps, total * (1 + noise), "engine")


def _sweep(noise: float = 0.0, seed: int = 1) -> list[Observation]:
    rng = random.Random(seed)

    def jitter() -> float:
        return rng.gauss(0.0, noise)

    observations = [
        prefill(load, TRUTH.batch_time_s(load, 0) * (1 + jitter()), "engine") for load in LOADS
    ]
    observations += [
        _decode(8, 16, 8, 60, jitter()),
        _decode(64, 1024, 640, 40, jitter()),
        _decode(256, 16, 256, 30, jitter()),
    ]
    window = _decode(32, 64, 32, 10)
    mixed_s = window.time_s - TRUTH.batch_time_s(32, 0) + TRUTH.batch_time_s(32 + 1024, 0)
    observations.append(mixed_window(window, 1024, mixed_s))
    return observations


def test_exact_measurements_give_the_exact_coefficients() -> None:
    fit = fit_observations(_sweep())

    assert fit.constant_s == pytest.approx(TRUTH.c_s, rel=1e-9)
    assert fit.a_s_per_token == pytest.approx(TRUTH.a_s_per_token, rel=1e-9)
    assert fit.b0_tokens == TRUTH.b0_tokens
    assert fit.attention_s_per_token == pytest.approx(TRUTH.attention_s_per_token, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.points == len(_sweep())
    assert max(abs(r) for r in fit.residuals_s) < 1e-12


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_percent_noise_stays_within_five_percent(seed: int) -> None:
    fit = fit_observations(_sweep(noise=0.01, seed=seed))

    assert fit.constant_s == pytest.approx(TRUTH.c_s, rel=0.05)
    assert fit.a_s_per_token == pytest.approx(TRUTH.a_s_per_token, rel=0.05)
    assert fit.b0_tokens == pytest.approx(TRUTH.b0_tokens, rel=0.05)
    assert 0.99 < fit.r2 < 1.0
    assert fit.rms_residual_s > 0


def test_step_prediction_matches_the_model() -> None:
    fit = fit_observations(_sweep())
    for load, context in ((1, 0), (200, 0), (3000, 50_000)):
        assert fit.step_s(load, context) == pytest.approx(TRUTH.batch_time_s(load, context))


def test_load_independent_times_fit_a_flat_line() -> None:
    flat = [prefill(load, 0.01, "client") for load in LOADS]
    fit = fit_observations(flat)
    assert fit.a_s_per_token == 0.0
    assert fit.b0_tokens == max(LOADS)
    assert fit.constant_s == pytest.approx(0.01)


def test_coefficients_never_go_negative() -> None:
    """Times that fall with load (a broken measurement) still give a valid model."""
    falling = [prefill(load, 0.02 - 1e-6 * load, "client") for load in LOADS]
    fit = fit_observations(falling)
    assert fit.a_s_per_token >= 0 and fit.attention_s_per_token >= 0 and fit.constant_s >= 0


def test_too_few_measurements_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least 4"):
        fit_observations([prefill(8, 0.01, "engine")] * 3)
    with pytest.raises(ConfigError, match="two or more token loads"):
        fit_observations([prefill(8, 0.01, "engine")] * 5)


def test_decode_window_context_is_the_sum_over_its_steps() -> None:
    running, prompt, outputs, steps = 5, 30, 12, 7
    window = decode_window(running, prompt, outputs, steps, 1.0, "engine")
    brute = sum(running * prompt + outputs + running * s for s in range(steps))
    assert window.context_tokens == brute
    assert window.steps == steps and window.tokens == running * steps


def test_mixed_window_has_one_step_at_the_combined_load() -> None:
    window = decode_window(16, 10, 16, 4, 0.0, "engine")
    mixed = mixed_window(window, 512, 0.1)
    assert mixed.loads == ((16, 3), (528, 1))
    assert mixed.steps == 4
    assert mixed_window(decode_window(16, 10, 16, 1, 0.0, "engine"), 512, 0.1).loads == ((528, 1),)
