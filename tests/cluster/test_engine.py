"""Engine choice: sglang only with GPUs, SGLang and a model; the notice says what is missing."""

from __future__ import annotations

import pytest

from fairserve.cluster import engine
from fairserve.commands import launch
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
    with pytest.raises(FairserveError, match="SGLang") as caught:
        engine.check_sglang("meta-llama/Llama-3.1-8B")
    assert not isinstance(caught.value, ConfigError)


def test_command_constants_match_the_package() -> None:
    assert launch.ENGINES == engine.ENGINES
