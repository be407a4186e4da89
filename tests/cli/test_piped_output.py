"""Data piped or logged is never cut: rich would assume 80 columns (or ``$COLUMNS``) when
stdout is not a terminal and crop cells to ``180.9…``, so ``grep`` and log files lost
digits. Each test runs the real CLI with stdout to a pipe and a narrow ``COLUMNS``, and
checks the full values against the same run's ``--json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.conftest import RunCli
from tests.cli.test_launch import env, stop_and_reap  # noqa: F401  (fixture)
from tests.worker.helpers import write_profile

NARROW = {"COLUMNS": "60"}
COMPARE = "dlpm/doubleq,vtc/round-robin,fcfs/round-robin,lpm/cache-aware,justitia/least-load"


def _lines_with(text: str, *needles: str) -> list[str]:
    return [line for line in text.splitlines() if all(n in line for n in needles)]


def test_simulate_compare_piped_is_whole(run_cli: RunCli) -> None:
    args = ("simulate", "--workload", "tot-s1", "--duration", "10", "--compare", COMPARE)
    human = run_cli(*args, env=NARROW)
    assert human.returncode == 0, human.stderr
    assert "…" not in human.stdout
    # The per-client p99 table has one column per run, all on the header line.
    assert _lines_with(human.stdout, "client", *COMPARE.split(","))
    data = json.loads(run_cli(*args, "--json", env=NARROW).stdout)
    for run in data["runs"]:
        assert f"{run['throughput']['tokens_per_s']:,.0f}" in human.stdout


def test_tune_sweep_piped_is_whole(run_cli: RunCli) -> None:
    args = ("tune", "quantum", "--sweep", "--workload", "vtc-constant", "--grid", "128,1024",
            "--worker-grid", "1024,inf", "--duration", "20")  # fmt: skip
    human = run_cli(*args, env=NARROW)
    assert human.returncode == 0, human.stderr
    assert "…" not in human.stdout
    data = json.loads(run_cli(*args, "--json", env=NARROW).stdout)
    for row in data["rows"]:
        gap = f"{row['max_service_gap']:,.0f}"
        assert _lines_with(human.stdout, f"{row['tokens_per_s']:,.0f}", gap), (gap, human.stdout)


def test_status_piped_is_whole(run_cli: RunCli, env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    profile = str(write_profile(tmp_path))
    launched = run_cli("launch", "--detach", "--port", "0", "--workers", "1",
                       "--profile", profile, env=env)  # fmt: skip
    try:
        assert launched.returncode == 0, launched.stderr
        status = run_cli("status", env={**env, **NARROW})
        assert status.returncode == 0, status.stderr
        data = json.loads(run_cli("status", "--json", env=env).stdout)
        worker = data["workers"][0]
        assert "…" not in status.stdout
        assert _lines_with(status.stdout, worker["url"], str(worker["pid"]), worker["log"])
        assert data["router"]["url"] in status.stdout
    finally:
        stop_and_reap(run_cli, env)


def test_status_of_a_dead_router_exits_3_with_a_clear_message(run_cli: RunCli) -> None:
    from tests.worker.processes import free_port

    url = f"http://127.0.0.1:{free_port()}"
    result = run_cli("status", "--url", url)
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip() == (
        f"fairserve: error: router unreachable at {url}: [Errno 111] Connection refused"
    )
