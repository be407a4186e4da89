"""Engine choice: sglang only with GPUs, SGLang and a model; the notice says what is missing."""

from __future__ import annotations

import pytest

from fairserve.cluster import engine
from fairserve.core.errors import ConfigError, FairserveError


@pytest.mark.parametrize(
    ("gpus", "sglang", "model", "expected", "why"),
    [
        (0, True, "m", "sim", "no NVIDIA GPU"),
        (2, False, "m", "sim", "SGLang is not installed"),
        (2, True, None, "sim", "no --model"),
        (2, True, "m", "sglang", "2 GPUs"),
    ],
)
def test_detect(gpus: int, sglang: bool, model: str | None, expected: str, why: str) -> None:
    choice = engine.detect(model, gpus=gpus, sglang=sglang)
    assert choice.engine == expected
    assert choice.notice is not None and why in choice.notice


def test_gpu_count_never_fails() -> None:
    assert engine.gpu_count() >= 0


def test_sglang_needs_a_model_then_an_install() -> None:
    with pytest.raises(ConfigError, match="--model is required"):
        engine.check_sglang(None)
    if engine.sglang_installed():
        engine.check_sglang("meta-llama/Llama-3.1-8B")
    else:
        with pytest.raises(FairserveError, match="SGLang is not installed") as caught:
            engine.check_sglang("meta-llama/Llama-3.1-8B")
        assert not isinstance(caught.value, ConfigError)
    engine.check_sglang("m", installed=False)  # --dry-run: any machine


@pytest.mark.parametrize(
    ("gpus", "tp", "workers", "found", "groups"),
    [
        ("0,1,2,3", 1, None, None, [(0,), (1,), (2,), (3,)]),
        ("0,1,2,3", 2, None, None, [(0, 1), (2, 3)]),
        ("4,5,6", 2, 1, None, [(4, 5)]),
        (None, 4, None, 8, [(0, 1, 2, 3), (4, 5, 6, 7)]),
        (None, 1, 2, 8, [(0,), (1,)]),
    ],
)
def test_gpu_groups(
    gpus: str | None, tp: int, workers: int | None, found: int | None, groups: list[tuple[int]]
) -> None:
    assert engine.gpu_groups(gpus, tp, workers, found) == groups


@pytest.mark.parametrize(
    ("gpus", "tp", "workers", "found", "message"),
    [
        ("0,1,2", 2, None, None, "do not split into groups of 2"),
        ("0,1", 1, 3, None, "needs 3 GPUs; 2 available"),
        ("0,0", 1, None, None, "must be distinct"),
        ("0,x", 1, None, None, "expected GPU ids"),
        ("0", 0, None, None, "--tp"),
    ],
)
def test_bad_gpu_groups_name_the_option(
    gpus: str, tp: int, workers: int | None, found: int | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        engine.gpu_groups(gpus, tp, workers, found)


def test_no_gpu_found_is_not_a_usage_error() -> None:
    with pytest.raises(FairserveError, match="pass --gpus") as caught:
        engine.gpu_groups(None, 1, found=0)
    assert not isinstance(caught.value, ConfigError)
