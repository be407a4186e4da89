"""Named shared prefixes: one system prompt used by several clients (``[[prefixes]]``)."""

from __future__ import annotations

import pytest

from fairserve.core.errors import ConfigError
from fairserve.core.types import TOKEN_BYTES
from fairserve.sim.cluster import SimConfig, simulate
from fairserve.sim.engine import EngineConfig
from fairserve.sim.profile import DEFAULT_PROFILE, resolve_profile
from fairserve.workloads import loads_workload

TWO_TEAMS = """
name = "teams"
duration_s = 20
seed = 3

[[prefixes]]
name = "sys"
tokens = 2000

[[clients]]
name = "alice"
shared_prefix = "sys"
shared_prefix_tokens = 100
arrival = "uniform"
rate_per_s = 1
input_tokens = 50
output_tokens = 8

[[clients]]
name = "bob"
shared_prefix = "sys"
arrival = "uniform"
start_s = 5
rate_per_s = 1
input_tokens = 50
output_tokens = 8
"""


def first_prompts(text: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for program in loads_workload(text).programs():
        out.setdefault(program.client, program.calls[0].prompt_key)
    return out


def test_clients_naming_one_prefix_start_with_the_same_tokens() -> None:
    prompts = first_prompts(TWO_TEAMS)
    sys_bytes = 2000 * TOKEN_BYTES
    assert prompts["alice"][:sys_bytes] == prompts["bob"][:sys_bytes]
    assert len(prompts["alice"]) == (2000 + 100 + 50) * TOKEN_BYTES  # sys, own, question
    assert len(prompts["bob"]) == (2000 + 50) * TOKEN_BYTES
    assert prompts["alice"][sys_bytes:] != prompts["bob"][sys_bytes:]


def test_without_the_named_prefix_clients_share_nothing() -> None:
    text = TWO_TEAMS.replace('shared_prefix = "sys"\n', "")
    prompts = first_prompts(text)
    assert prompts["alice"][:400] != prompts["bob"][:400]


def test_two_clients_sharing_a_prefix_hit_each_others_cache() -> None:
    profile = resolve_profile(DEFAULT_PROFILE)
    engine = EngineConfig(
        kv_capacity_tokens=profile.kv_capacity_tokens, max_batch_tokens=profile.max_batch_tokens
    )
    config = SimConfig(
        engine=engine, time_model=profile.batch_time(), policy="fcfs", dispatch="round-robin",
        workers=1,
    )  # fmt: skip

    def bob_first_cached(text: str) -> int:
        records = simulate(loads_workload(text), config).records
        return min(
            (r for r in records if r.client == "bob"), key=lambda r: r.arrival_s
        ).cached_tokens

    assert bob_first_cached(TWO_TEAMS) >= 2000  # alice's system prompt, cached before bob came
    assert bob_first_cached(TWO_TEAMS.replace('shared_prefix = "sys"\n', "")) == 0


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ('shared_prefix = "sys"', 'shared_prefix = "nope"'),
            r"shared_prefix: unknown prefix 'nope'; \[\[prefixes\]\]: sys",
        ),
        (("tokens = 2000", "tokens = 0"), r"prefixes\[0\]\.tokens: expected an integer >= 1"),
        (("tokens = 2000", 'tokens = 2000\nsize = 3'), r"prefixes\[0\]\.size: unknown key"),
        (('name = "sys"', 'name = "s y s"'), r"prefixes\[0\]\.name: expected letters"),
    ],
)  # fmt: skip
def test_bad_prefixes_are_refused_with_the_field(edit: tuple[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        loads_workload(TWO_TEAMS.replace(*edit, 1), "teams.toml")


def test_a_prefix_defined_twice_is_refused() -> None:
    twice = TWO_TEAMS.replace(
        "[[clients]]", '[[prefixes]]\nname = "sys"\ntokens = 5\n\n[[clients]]', 1
    )
    with pytest.raises(ConfigError, match="prefixes\\[1\\]\\.name: prefix 'sys' is defined twice"):
        loads_workload(twice, "teams.toml")
