"""Batch-time profiles: the shipped files are sane, files round-trip, bad files say where."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.errors import ConfigError, UnknownNameError
from fairserve.sim.profile import (
    DEFAULT_PROFILE,
    PROFILES_ENV,
    REPO_PROFILES_DIR,
    Profile,
    load_profile,
    profile_dirs,
    profile_from_toml,
    profile_to_toml,
    resolve_profile,
    shipped_profiles,
    write_profile,
)
from tests.fakes.profiles import synthetic_profile_toml

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO.parent / "shared" / "reference" / "vidur-profiling"
REQUIRED = {"a100-llama-3-8b", "a10g-llama-3.2-3b", "h100-llama-2-7b"}

VALID = synthetic_profile_toml(
    provenance="made up for a test",
    c_s=0.01,
    a_s_per_token=5e-05,
    b0_tokens=64,
    attention_s_per_token=1e-07,
    step_overhead_s=0.002,
    kv_capacity_tokens=100000,
    max_batch_tokens=8192,
    fit=(0.99, 10),
)


def make_profile(**changes: object) -> Profile:
    fields: dict[str, object] = {
        "name": "made",
        "gpu": "Test GPU",
        "model": "test/model",
        "engine": "sglang",
        "date": "2026-01-02",
        "source": "synthetic",
        "provenance": "made up for a test",
        "c_s": 0.01,
        "a_s_per_token": 5e-5,
        "b0_tokens": 64,
        "attention_s_per_token": 1e-7,
        "step_overhead_s": 0.002,
        "kv_capacity_tokens": 100_000,
        "max_batch_tokens": 8192,
    }
    return Profile(**(fields | changes))  # type: ignore[arg-type]


def write(tmp_path: Path, text: str, name: str = "bad.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- shipped profiles


def test_the_required_profiles_ship() -> None:
    names = {p.name for p in shipped_profiles()}

    assert names >= REQUIRED | {DEFAULT_PROFILE}


@pytest.mark.parametrize("profile", shipped_profiles(), ids=lambda p: p.name)
def test_shipped_profile_is_sane(profile: Profile) -> None:
    assert profile.c_s > 0 and profile.a_s_per_token > 0 and profile.b0_tokens > 0
    assert profile.attention_s_per_token > 0 and profile.step_overhead_s > 0
    assert 1e3 <= profile.capacity_tokens_per_s <= 2e5
    # Room for many full batches' worth of context, and a fit worth the name.
    assert profile.kv_capacity_tokens > 4 * profile.max_batch_tokens
    assert profile.fit_r2 is not None and profile.fit_r2 > 0.99
    assert profile.fit_points is not None and profile.fit_points > 100
    assert "estimated" in profile.provenance.lower()


def test_default_profile_is_the_a100_llama_3_8b() -> None:
    profile = resolve_profile(DEFAULT_PROFILE)

    assert "A100" in profile.gpu and profile.model == "meta-llama/Meta-Llama-3-8B"
    assert profile.max_batch_tokens == 8192


def test_estimated_profile_says_so() -> None:
    assert resolve_profile("a10g-llama-3.2-3b").provenance.startswith("ESTIMATED")


def test_faster_gpu_has_more_capacity_for_the_same_model() -> None:
    a40, a100, h100 = (resolve_profile(f"{g}-llama-2-7b") for g in ("a40", "a100", "h100"))

    assert a40.capacity_tokens_per_s < a100.capacity_tokens_per_s < h100.capacity_tokens_per_s


def test_batch_time_carries_every_coefficient() -> None:
    profile = make_profile()
    model = profile.batch_time()

    assert model.batch_time_s(64, 0) == pytest.approx(0.012)
    assert model.batch_time_s(1064, 1000) == pytest.approx(0.002 + 0.01 + 0.05 + 1e-4)
    assert profile.capacity_tokens_per_s == pytest.approx(8192 / model.batch_time_s(8192, 0))


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("profile", shipped_profiles(), ids=lambda p: p.name)
def test_shipped_file_is_what_the_emitter_writes(profile: Profile) -> None:
    assert profile.path is not None
    assert profile_to_toml(profile) == profile.path.read_text(encoding="utf-8")


def test_round_trip_with_every_optional_field(tmp_path: Path) -> None:
    profile = make_profile(
        source="measured",
        engine_version="0.5.23",
        tensor_parallel=2,
        max_running_requests=256,
        fit_r2=0.98,
        fit_points=40,
        joules_per_token=0.25,
    )

    loaded = load_profile(write_profile(profile, tmp_path / "sub" / "made.toml"))

    assert loaded == profile
    assert loaded.path == tmp_path / "sub" / "made.toml"


def test_round_trip_without_optional_tables(tmp_path: Path) -> None:
    profile = make_profile()
    text = profile_to_toml(profile)

    assert "[fit]" not in text and "[energy]" not in text
    assert load_profile(write_profile(profile, tmp_path / "made.toml")) == profile


@given(
    provenance=st.text(min_size=1).filter(str.strip),
    gpu=st.text(min_size=1).filter(lambda s: s.strip() != ""),
)
def test_any_text_round_trips(provenance: str, gpu: str) -> None:
    profile = make_profile(provenance=provenance, gpu=gpu)

    loaded = profile_from_toml(profile_to_toml(profile), name="made")

    assert loaded == profile


def test_unquoted_toml_date_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace('date = "2026-01-02"', "date = 2026-01-02"), "ok.toml")

    assert load_profile(path).date == "2026-01-02"


# ---------------------------------------------------------------- malformed files

MALFORMED = [
    ("syntax", VALID.replace("c_s = 0.01", "c_s = "), "line 10"),
    ("unknown-table", VALID.replace("[capacity]", "[capacity2]"), "unknown table [capacity2]"),
    ("no-capacity", VALID.split("[capacity]")[0], "missing table [capacity]"),
    ("missing-field", VALID.replace("a_s_per_token = 5e-05\n", ""), "batch_time.a_s_per_token"),
    ("wrong-type", VALID.replace("c_s = 0.01", 'c_s = "fast"'), "batch_time.c_s"),
    ("bool-number", VALID.replace("step_overhead_s = 0.002", "step_overhead_s = true"), "a number"),
    ("float-for-int", VALID.replace("b0_tokens = 64", "b0_tokens = 64.5"), "an integer"),
    ("negative", VALID.replace("a_s_per_token = 5e-05", "a_s_per_token = -5e-05"), ">= 0"),
    ("nan", VALID.replace("c_s = 0.01", "c_s = nan"), "batch_time.c_s"),
    ("inf", VALID.replace("= 1e-07", "= inf"), "batch_time.attention_s_per_token"),
    ("zero-kv", VALID.replace("= 100000", "= 0"), "capacity.kv_capacity_tokens"),
    ("r2-above-1", VALID.replace("r2 = 0.99", "r2 = 1.5"), "fit.r2"),
    ("bad-source", VALID.replace('"synthetic"', '"guessed"'), "profile.source"),
    ("bad-date", VALID.replace('"2026-01-02"', '"yesterday"'), "profile.date"),
    ("empty-gpu", VALID.replace('"Test GPU"', '""'), "profile.gpu"),
    ("typo-key", VALID.replace("a_s_per_token", "a_s_per_tokn"), "did you mean 'a_s_per_token'"),
    ("half-fit", VALID.replace("points = 10\n", ""), "fit.points"),
    ("no-time", VALID.replace("c_s = 0.01", "c_s = 0").replace("= 0.002", "= 0"), "c_s"),
]


@pytest.mark.parametrize(("case", "text", "expected"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_file_names_file_and_field(
    tmp_path: Path, case: str, text: str, expected: str
) -> None:
    path = write(tmp_path, text)

    with pytest.raises(ConfigError) as info:
        load_profile(path)

    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_typo_key_also_names_the_dotted_field(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("a_s_per_token", "a_s_per_tokn"))

    with pytest.raises(ConfigError, match=r"unknown key batch_time\.a_s_per_tokn"):
        load_profile(path)


def test_wrong_type_says_what_was_expected(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("c_s = 0.01", 'c_s = "fast"'))

    with pytest.raises(ConfigError, match=r"batch_time\.c_s: expected a number, got 'fast'"):
        load_profile(path)


def test_table_that_is_not_a_table(tmp_path: Path) -> None:
    text = "energy = 3\n" + VALID

    with pytest.raises(ConfigError, match="energy: expected a table"):
        load_profile(write(tmp_path, text))


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nowhere\.toml: profile file not found"):
        load_profile(tmp_path / "nowhere.toml")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"c_s": -1.0}, "batch_time.c_s"),
        ({"max_batch_tokens": 0}, "capacity.max_batch_tokens"),
        ({"tensor_parallel": 0}, "profile.tensor_parallel"),
        ({"joules_per_token": math.nan}, "energy.joules_per_token"),
        ({"fit_r2": 0.9}, "fit"),
    ],
)
def test_constructed_profile_is_validated_too(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"profile 'made': {field}"):
        make_profile(**changes)


# ---------------------------------------------------------------- lookup


def test_resolve_by_name_and_by_path_agree() -> None:
    by_name = resolve_profile(DEFAULT_PROFILE)
    assert by_name.path is not None

    assert resolve_profile(str(by_name.path)) == by_name
    assert resolve_profile(by_name.path) == by_name
    assert by_name.name == DEFAULT_PROFILE


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        resolve_profile("a100-llama-9000")

    assert DEFAULT_PROFILE in info.value.known
    assert "unknown profile 'a100-llama-9000'" in str(info.value)


def test_path_like_name_that_does_not_exist_is_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="profile file not found"):
        resolve_profile(str(tmp_path / "gone.toml"))


def test_env_dirs_come_first_and_shadow_the_repo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    write_profile(make_profile(gpu="Shadowing GPU"), first / f"{DEFAULT_PROFILE}.toml")
    write_profile(make_profile(), second / "custom.toml")
    monkeypatch.setenv(PROFILES_ENV, f"{first}{os.pathsep}{second}")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    user_dir = tmp_path / "data" / "fairserve" / "profiles"

    assert profile_dirs() == [first, second, user_dir, REPO_PROFILES_DIR]
    assert resolve_profile(DEFAULT_PROFILE).gpu == "Shadowing GPU"
    assert resolve_profile("custom").name == "custom"
    assert resolve_profile("h100-llama-2-7b").gpu.startswith("NVIDIA H100")


def test_empty_env_entries_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROFILES_ENV, "")
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")

    user_dir = Path.home() / ".local" / "share" / "fairserve" / "profiles"
    assert profile_dirs() == [user_dir, REPO_PROFILES_DIR]


# ---------------------------------------------------------------- derivation drift

needs_reference = pytest.mark.skipif(
    not REFERENCE.is_dir(), reason="reference data (../shared/reference) is not beside the repo"
)


@functools.cache
def derive_script() -> ModuleType:
    """scripts/derive_profiles.py as a module (registered: its dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(
        "derive_profiles", REPO / "scripts" / "derive_profiles.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@needs_reference
def test_committed_profiles_match_the_derivation() -> None:
    assert derive_script().main(["--check"]) == 0


@needs_reference
def test_check_notices_a_drifted_profile(tmp_path: Path) -> None:
    shutil.copytree(REPO_PROFILES_DIR, tmp_path, dirs_exist_ok=True)
    target = tmp_path / f"{DEFAULT_PROFILE}.toml"
    target.write_text(target.read_text().replace("b0_tokens = ", "b0_tokens = 1"))

    assert derive_script().main(["--check", "--out", str(tmp_path)]) == 1


@needs_reference
def test_derivation_writes_loadable_profiles(tmp_path: Path) -> None:
    assert derive_script().main(["--out", str(tmp_path)]) == 0

    written = {p.stem: load_profile(p) for p in tmp_path.glob("*.toml")}
    shipped = {p.name: dataclasses.replace(p, path=None) for p in shipped_profiles()}
    assert {name: dataclasses.replace(p, path=None) for name, p in written.items()} == {
        name: shipped[name] for name in written
    }
