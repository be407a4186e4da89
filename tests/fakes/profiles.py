"""The synthetic engine profile the tests write as TOML (``fairserve worker --profile``,
``profile_from_toml``), in one place: every field of the format, with the batch time and
capacity a test needs."""

from __future__ import annotations


def synthetic_profile_toml(
    *,
    provenance: str,
    model: str = "test/model",
    c_s: float,
    a_s_per_token: float,
    b0_tokens: int,
    kv_capacity_tokens: int,
    max_batch_tokens: int,
    attention_s_per_token: float = 0.0,
    step_overhead_s: float = 0.0,
    fit: tuple[float, int] | None = None,
) -> str:
    """A profile's TOML text; ``fit`` adds the ``[fit]`` table as ``(r2, points)``. Numbers
    are written as Python prints them (``5e-05``), which tests that edit the text rely on."""
    text = f"""\
[profile]
gpu = "Test GPU"
model = "{model}"
engine = "sglang"
date = "2026-01-02"
source = "synthetic"
provenance = "{provenance}"

[batch_time]
c_s = {c_s}
a_s_per_token = {a_s_per_token}
b0_tokens = {b0_tokens}
attention_s_per_token = {attention_s_per_token}
step_overhead_s = {step_overhead_s}

[capacity]
kv_capacity_tokens = {kv_capacity_tokens}
max_batch_tokens = {max_batch_tokens}
"""
    if fit is not None:
        r2, points = fit
        text += f"\n[fit]\nr2 = {r2}\npoints = {points}\n"
    return text
