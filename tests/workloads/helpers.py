"""Workload factories for the workload tests: small dict-built workloads, one knob at a time."""

from __future__ import annotations

import itertools
from typing import Any

from fairserve.workloads import Program, SyntheticWorkload, parse_workload


def client(name: str = "alice", **fields: Any) -> dict[str, Any]:
    """A valid ``[[clients]]`` table: single program, poisson at 2/s, 100 in / 20 out."""
    table: dict[str, Any] = {
        "name": name,
        "rate_per_s": 2.0,
        "input_tokens": 100,
        "output_tokens": 20,
    }
    table.update(fields)
    return table


def document(*clients: dict[str, Any], **top: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "test", "duration_s": 60.0, "seed": 7}
    data.update(top)
    data["clients"] = list(clients) if clients else [client()]
    return data


def workload(*clients: dict[str, Any], **top: Any) -> SyntheticWorkload:
    return parse_workload(document(*clients, **top), "test.toml")


def take(w: SyntheticWorkload, n: int, **kwargs: Any) -> list[Program]:
    return list(itertools.islice(w.programs(**kwargs), n))
