"""The workload file format: every field form parses, every mistake names file and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.errors import ConfigError
from fairserve.workloads import ClientInfo, load_workload, loads_workload, parse_workload
from fairserve.workloads.dists import Constant, LogNormal, Uniform
from fairserve.workloads.parse import _ALL_KEYS, parse_spec
from fairserve.workloads.spec import MAX_TOKENS, ClientSpec, WorkloadSpec

from .helpers import client, document


def spec_of(*clients: dict[str, Any], **top: Any) -> WorkloadSpec:
    return parse_spec(document(*clients, **top), "test.toml")


def only_client(**fields: Any) -> ClientSpec:
    (spec,) = spec_of(client(**fields)).clients
    return spec


def test_defaults() -> None:
    data = document(client())
    del data["seed"], data["name"]
    spec = parse_spec(data, "dir/my-load.toml")
    assert spec.name == "my-load"
    assert spec.seed == 0
    assert spec.description == ""
    (alice,) = spec.clients
    assert (alice.weight, alice.program, alice.arrival.kind) == (1.0, "single", "poisson")
    assert alice.arrival.rate_per_s == 2.0
    assert (alice.start_s, alice.stop_s) == (0.0, None)
    assert alice.shared_prefix_tokens == Constant(0)
    assert alice.max_output_tokens is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (300, Constant(300)),
        ({"dist": "constant", "value": 5}, Constant(5)),
        ({"dist": "uniform", "min": 10, "max": 20}, Uniform(10, 20)),
        ({"dist": "lognormal", "mean": 100, "cv": 0.5}, LogNormal(100, 0.5, 1, MAX_TOKENS)),
        (
            {"dist": "lognormal", "mean": 100, "cv": 0.5, "min": 8, "max": 400},
            LogNormal(100, 0.5, 8, 400),
        ),
    ],
)
def test_length_forms(value: object, expected: object) -> None:
    spec = only_client(input_tokens=value, output_tokens=value, max_output_tokens=value)
    assert spec.input_tokens == expected
    assert spec.output_tokens == expected
    assert spec.max_output_tokens == expected


def test_shared_prefix_may_be_zero_and_think_time_real() -> None:
    spec = only_client(
        program="multi-turn",
        turns={"dist": "uniform", "min": 1, "max": 4},
        think_time_s={"dist": "uniform", "min": 0.5, "max": 2.5},
        shared_prefix_tokens={"dist": "uniform", "min": 0, "max": 10},
    )
    assert spec.turns == Uniform(1, 4)
    assert spec.think_time_s == Uniform(0.5, 2.5, integer=False)
    assert spec.shared_prefix_tokens == Uniform(0, 10)


@pytest.mark.parametrize(
    ("fields", "check"),
    [
        ({"arrival": "poisson"}, {"kind": "poisson", "spacing": "poisson"}),
        ({"arrival": "gamma", "cv": 2}, {"kind": "gamma", "spacing": "gamma", "cv": 2.0}),
        ({"arrival": "uniform"}, {"kind": "uniform", "spacing": "uniform"}),
        (
            {"arrival": "on-off", "on_s": 10, "off_s": 20},
            {"kind": "on-off", "spacing": "poisson", "on_s": 10.0, "off_s": 20.0},
        ),
        (
            {"arrival": "on-off", "on_s": 10, "off_s": 0, "spacing": "gamma", "cv": 0.5},
            {"spacing": "gamma", "cv": 0.5, "off_s": 0.0},
        ),
        (
            {"arrival": "ramp", "rate_per_s": 0, "rate_end_per_s": 9, "spacing": "uniform"},
            {"kind": "ramp", "rate_per_s": 0.0, "rate_end_per_s": 9.0, "ramp_s": 60.0},
        ),
        (
            {"arrival": "ramp", "rate_end_per_s": 1, "start_s": 10, "stop_s": 40},
            {"ramp_s": 30.0},
        ),
    ],
)
def test_arrival_forms(fields: dict[str, Any], check: dict[str, object]) -> None:
    arrival = only_client(**fields).arrival
    for key, value in check.items():
        assert getattr(arrival, key) == value, key


@pytest.mark.parametrize(
    ("fields", "check"),
    [
        ({"program": "single"}, {}),
        ({"program": "long-qa", "shared_prefix_tokens": 1000}, {"documents": 1}),
        ({"program": "long-qa", "shared_prefix_tokens": 9, "documents": 3}, {"documents": 3}),
        ({"program": "multi-turn", "turns": 3}, {"turns": Constant(3)}),
        (
            {"program": "tree-of-thought", "branches": 3, "depth": 2, "step_tokens": 4},
            {"branches": 3, "depth": 2, "step_tokens": Constant(4)},
        ),
        ({"program": "judge", "dimensions": 5, "think_time_s": 1.5}, {"dimensions": 5}),
    ],
)
def test_program_forms(fields: dict[str, Any], check: dict[str, object]) -> None:
    spec = only_client(**fields)
    assert spec.program == fields["program"]
    for key, value in check.items():
        assert getattr(spec, key) == value, key


def test_count_expands_to_numbered_clients() -> None:
    w = parse_workload(document(client("good", count=3), client("bad", weight=2)), "t.toml")
    assert w.clients == (
        ClientInfo("good1"),
        ClientInfo("good2"),
        ClientInfo("good3"),
        ClientInfo("bad", 2.0),
    )


def test_entries_with_one_name_are_one_client_in_phases() -> None:
    spec = spec_of(
        client("a", stop_s=30),
        client("b"),
        client("a", start_s=30, arrival="uniform"),
    )
    assert [(c.name, c.occurrence) for c in spec.clients] == [("a", 0), ("b", 0), ("a", 1)]
    w = parse_workload(document(client("a", stop_s=30), client("a", start_s=30)), "t.toml")
    assert w.clients == (ClientInfo("a"),)


def test_load_from_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        'duration_s = 10\n[[clients]]\nname = "x"\nrate_per_s = 1\n'
        'input_tokens = { dist = "uniform", min = 1, max = 3 }\noutput_tokens = 4\n'
    )
    w = load_workload(path)
    assert (w.name, w.duration_s, w.seed) == ("mine", 10.0, 0)


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('name = "x"\nduration_s = = 3\n')
    with pytest.raises(ConfigError, match=r"broken\.toml: invalid TOML: .*line 2"):
        load_workload(path)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: cannot read workload file"):
        load_workload(tmp_path / "nope.toml")


def test_loads_names_its_source() -> None:
    with pytest.raises(ConfigError, match=r"^inline: clients: expected a non-empty array"):
        loads_workload("duration_s = 5\n", "inline")


def _set(path: str, value: object) -> Any:
    """A mutation of the base document: set (or with ``...`` delete) a dotted path."""

    def apply(data: dict[str, Any]) -> None:
        *parents, last = path.replace("[", ".").replace("]", "").split(".")
        target: Any = data
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        index: Any = int(last) if last.isdigit() else last
        if value is ...:
            del target[index]
        else:
            target[index] = value

    return apply


def _base() -> dict[str, Any]:
    return document(client("alice"), client("bob"))


MALFORMED = [
    ("duration_s", -1, "duration_s: expected a positive number, got -1"),
    ("duration_s", ..., "duration_s: missing"),
    ("duration_s", "60", "duration_s: expected a positive number, got '60'"),
    ("seed", -1, "seed: expected an integer >= 0"),
    ("seed", 1.5, "seed: expected an integer >= 0"),
    ("name", "", "name: expected a non-empty string"),
    ("description", 3, "description: expected a string"),
    ("durration_s", 3, "durration_s: unknown key; expected one of: clients, description"),
    ("clients", ..., "clients: expected a non-empty array"),
    ("clients", [], "clients: expected a non-empty array"),
    ("clients[1]", 3, "clients[1]: expected a table"),
    ("clients[1].rate_per_s", -3, "clients[1].rate_per_s: expected a positive number, got -3"),
    ("clients[1].rate_per_s", ..., "clients[1].rate_per_s: missing"),
    ("clients[1].rate", 3, "clients[1].rate: unknown key"),
    ("clients[0].name", ..., "clients[0].name: missing"),
    ("clients[0].name", "a b", "clients[0].name: expected letters"),
    ("clients[0].name", "a/b", "clients[0].name: expected letters"),
    ("clients[0].program", "chat", "clients[0].program: expected one of: single, multi-turn"),
    ("clients[0].arrival", "burst", "clients[0].arrival: expected one of: poisson, gamma"),
    ("clients[0].weight", 0, "clients[0].weight: expected a positive number, got 0"),
    ("clients[0].count", 0, "clients[0].count: expected an integer >= 1"),
    ("clients[0].start_s", -1, "clients[0].start_s: expected a number >= 0"),
    ("clients[0].start_s", 60, "clients[0].start_s: expected a time before duration_s (60)"),
    ("clients[0].stop_s", 0, "clients[0].stop_s: expected a positive number, got 0"),
    ("clients[1].start_s", "0", "clients[1].start_s: expected a number >= 0, got '0'"),
    ("clients[0].input_tokens", 0, "clients[0].input_tokens: expected an integer >= 1, got 0"),
    ("clients[0].input_tokens", 1.5, "clients[0].input_tokens: expected an integer >= 1"),
    ("clients[0].input_tokens", True, "clients[0].input_tokens: expected an integer >= 1"),
    ("clients[0].input_tokens", "100", "clients[0].input_tokens: expected an integer >= 1"),
    ("clients[0].input_tokens", ..., "clients[0].input_tokens: missing"),
    ("clients[0].output_tokens", ..., "clients[0].output_tokens: missing"),
    ("clients[0].max_output_tokens", 0, "clients[0].max_output_tokens: expected an integer"),
    ("clients[0].shared_prefix_tokens", -1, "clients[0].shared_prefix_tokens: expected an"),
    ("clients[0].input_tokens", {"dist": "normal"}, "clients[0].input_tokens.dist: expected"),
    ("clients[0].input_tokens", {"value": 3}, "clients[0].input_tokens.dist: missing"),
    (
        "clients[0].input_tokens",
        {"dist": "uniform", "min": 10},
        "clients[0].input_tokens.max: missing (expected an integer >= 10)",
    ),
    (
        "clients[0].input_tokens",
        {"dist": "uniform", "min": 10, "max": 5},
        "clients[0].input_tokens.max: expected an integer >= 10, got 5",
    ),
    (
        "clients[0].output_tokens",
        {"dist": "lognormal", "mean": 10},
        "clients[0].output_tokens.cv: missing",
    ),
    (
        "clients[0].output_tokens",
        {"dist": "lognormal", "mean": 0, "cv": 1},
        "clients[0].output_tokens.mean: expected a positive number, got 0",
    ),
    (
        "clients[0].output_tokens",
        {"dist": "lognormal", "mean": 10, "cv": 1, "sigma": 2},
        "clients[0].output_tokens.sigma: unknown key; expected one of: cv, dist, max, mean, min",
    ),
    (
        "clients[0].output_tokens",
        {"dist": "constant", "value": 3, "min": 1},
        "clients[0].output_tokens.min: unknown key",
    ),
    ("clients[0].cv", 2, "clients[0].cv: not used by arrival 'poisson' (only by gamma, on-off"),
    ("clients[0].on_s", 2, "clients[0].on_s: not used by arrival 'poisson' (only by on-off)"),
    ("clients[0].spacing", "uniform", "clients[0].spacing: not used by arrival 'poisson'"),
    ("clients[0].branches", 2, "clients[0].branches: not used by program 'single'"),
    ("clients[0].turns", 2, "clients[0].turns: not used by program 'single' (only by multi"),
    ("clients[0].think_time_s", 1, "clients[0].think_time_s: not used by program 'single'"),
    ("clients[0].count", 10**6, "clients[0].count: expected an integer <= 10000 (a larger"),
    ("clients[0].input_tokens", 2**40, "clients[0].input_tokens: expected an integer <= 1048576"),
    (
        "clients[0].output_tokens",
        {"dist": "uniform", "min": 1, "max": 2**21},
        "clients[0].output_tokens.max: expected an integer <= 1048576",
    ),
]


@pytest.mark.parametrize(("path", "value", "message"), MALFORMED)
def test_malformed_document_names_file_and_field(path: str, value: object, message: str) -> None:
    data = _base()
    _set(path, value)(data)
    with pytest.raises(ConfigError) as info:
        parse_spec(data, "test.toml")
    assert str(info.value).startswith(f"test.toml: {message}"), str(info.value)


MALFORMED_CLIENT = [
    ({"arrival": "gamma"}, "clients[1].cv: missing"),
    ({"arrival": "gamma", "cv": 0}, "clients[1].cv: expected a positive number"),
    ({"arrival": "on-off", "off_s": 1}, "clients[1].on_s: missing"),
    ({"arrival": "on-off", "on_s": 1}, "clients[1].off_s: missing"),
    ({"arrival": "on-off", "on_s": 1, "off_s": 1, "spacing": "x"}, "clients[1].spacing: expected"),
    (
        {"arrival": "on-off", "on_s": 1, "off_s": 1, "cv": 2},
        "clients[1].cv: only used with gamma spacing, not 'poisson'",
    ),
    ({"arrival": "ramp"}, "clients[1].rate_end_per_s: missing"),
    (
        {"arrival": "ramp", "rate_per_s": 0, "rate_end_per_s": 0},
        "clients[1].rate_end_per_s: expected a positive rate at one end of the ramp",
    ),
    ({"program": "long-qa"}, "clients[1].shared_prefix_tokens: missing"),
    (
        {"program": "long-qa", "shared_prefix_tokens": 5, "documents": 0},
        "clients[1].documents: expected an integer >= 1, got 0",
    ),
    ({"program": "multi-turn"}, "clients[1].turns: missing"),
    ({"program": "multi-turn", "turns": 0}, "clients[1].turns: expected an integer >= 1"),
    (
        {"program": "multi-turn", "turns": 2, "think_time_s": -1},
        "clients[1].think_time_s: expected a number >= 0, got -1",
    ),
    ({"program": "tree-of-thought", "depth": 2}, "clients[1].branches: missing"),
    ({"program": "tree-of-thought", "branches": 2}, "clients[1].depth: missing"),
    (
        {"program": "tree-of-thought", "branches": 2, "depth": 0},
        "clients[1].depth: expected an integer >= 1",
    ),
    (
        {"program": "tree-of-thought", "branches": 10, "depth": 6},
        "clients[1].depth: expected a tree of at most 10000 calls (this one has 1111110)",
    ),
    (
        {"program": "tree-of-thought", "branches": 2, "depth": 2**40},
        "clients[1].depth: expected an integer <= 64",
    ),
    ({"program": "multi-turn", "turns": 5000}, "clients[1].turns: expected an integer <= 1000"),
    (
        {"program": "tree-of-thought", "branches": 2, "depth": 2, "documents": 2},
        "clients[1].documents: not used by program 'tree-of-thought' (only by long-qa)",
    ),
    ({"program": "judge", "dimensions": 0}, "clients[1].dimensions: expected an integer >= 1"),
    (
        {"program": "judge", "dimensions": 2, "step_tokens": -1},
        "clients[1].step_tokens: expected an integer >= 0",
    ),
    (
        {"start_s": 10, "stop_s": 10},
        "clients[1].stop_s: expected a time after start_s (10), got 10",
    ),
]


@pytest.mark.parametrize(("fields", "message"), MALFORMED_CLIENT)
def test_malformed_client_names_file_and_field(fields: dict[str, Any], message: str) -> None:
    data = document(client("alice"), client("bob", **fields))
    with pytest.raises(ConfigError) as info:
        parse_spec(data, "test.toml")
    assert str(info.value).startswith(f"test.toml: {message}"), str(info.value)


def test_entries_of_one_client_must_agree_on_weight() -> None:
    data = document(client("alice"), client("bob"), client("alice", weight=2))
    with pytest.raises(ConfigError) as info:
        parse_spec(data, "test.toml")
    assert str(info.value) == (
        "test.toml: clients[2].weight: client 'alice' already has weight 1 (clients[0]); "
        "entries of one client must use the same weight"
    )


TOML_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["lognormal", "uniform", "constant", "gamma", "on-off", "judge"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
DIST_TABLES = st.fixed_dictionaries(
    {"dist": st.sampled_from(["lognormal", "uniform", "constant"])},
    optional={key: TOML_VALUES for key in ("value", "min", "max", "mean", "cv")},
)


@given(
    key=st.sampled_from([*sorted(_ALL_KEYS), "typo"]),
    value=TOML_VALUES | DIST_TABLES,
    program=st.sampled_from(["single", "long-qa", "multi-turn", "tree-of-thought", "judge"]),
)
def test_any_value_either_parses_or_is_a_config_error_naming_the_field(
    key: str, value: object, program: str
) -> None:
    entry = client("x", program=program, shared_prefix_tokens=10)
    entry[key] = value
    data = document(client("ok"), entry)
    try:
        parse_spec(data, "fuzz.toml")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.toml: clients[1]"), str(exc)
