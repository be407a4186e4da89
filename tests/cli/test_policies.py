"""``fairserve policies``: every registered policy and dispatcher, from the registry."""

from __future__ import annotations

import json
from typing import Any

from fairserve.sched.registry import describe_all
from tests.cli.conftest import RunCli

LOCAL = {"fcfs", "lpm", "vtc", "lcf", "dlpm", "rpm", "justitia", "preble"}
DISPATCH = {"round-robin", "least-load", "cache-aware", "client-rr", "doubleq", "preble-e2"}


def test_json_lists_exactly_the_registered_names(run_cli: RunCli) -> None:
    result = run_cli("policies", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    data = json.loads(result.stdout)
    assert set(data) == {"local_policies", "dispatchers"}
    assert {e["name"] for e in data["local_policies"]} == LOCAL
    assert {e["name"] for e in data["dispatchers"]} == DISPATCH


def test_json_is_the_registry_description(run_cli: RunCli) -> None:
    # Keyed by name: the registry lists in registration order, and in this process other
    # test modules may have imported policy modules before load_all() did.
    def by_name(described: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
        return {kind: {e["name"]: e for e in entries} for kind, entries in described.items()}

    result = run_cli("policies", "--json")
    assert by_name(json.loads(result.stdout)) == by_name(json.loads(json.dumps(describe_all())))


def test_every_entry_is_described(run_cli: RunCli) -> None:
    data = json.loads(run_cli("policies", "--json").stdout)
    for entry in data["local_policies"] + data["dispatchers"]:
        assert entry["description"].strip(), entry["name"]
        for param in entry["params"]:
            assert {"name", "type", "default", "description"} <= set(param)


def test_tables_name_every_policy_and_parameter(run_cli: RunCli) -> None:
    result = run_cli("policies")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    for name in LOCAL | DISPATCH | {"quantum", "w_e", "w_q"}:
        assert name in result.stdout
    assert "local_policies" not in result.stdout  # tables, not JSON
