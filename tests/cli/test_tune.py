"""``fairserve tune``: show, set and sweep the quantum, change weights; errors and exit codes.

The live commands run in-process (``run([...])``) against a router and simulated workers
serving from a background thread (``tests.tuning.live``), one cluster for the module. The
auto-tuner's end-to-end run is in tests/tuning/test_live.py.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fairserve.cluster import runfile
from fairserve.cluster.runfile import RunInfo
from fairserve.commands.app import run
from fairserve.commands.errors import ExitCode
from fairserve.workloads import TraceWriter, resolve_workload
from tests.tuning.live import Live, live_cluster

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens there
SWEEP = ["tune", "quantum", "--sweep", "--workload", "long-qa-s1", "--duration", "10"]


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with live_cluster(workers=2) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No run file of the user's, no admin token from the environment."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("FAIRSERVE_ADMIN_TOKEN", raising=False)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def as_json(text: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(text)
    return data


def worker_quantum(url: str) -> float:
    with urllib.request.urlopen(url + "/fairserve/worker/quantum", timeout=5) as resp:
        return float(json.loads(resp.read())["quantum"])


def write_run_file(live: Live) -> None:
    pid = os.getpid()
    created = runfile.process_create_time(pid)
    assert created is not None
    info = RunInfo(live.url, live.token, pid, created, "sim", "dlpm", "doubleq", None, None, "/")
    runfile.write(info)


# ---------------------------------------------------------------------- show and set
def test_show_reads_the_run_file_and_prints_bounds(
    live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run_file(live)
    code, out, err = cli(capsys, "tune", "quantum", "--json")
    assert code == 0, err
    report = as_json(out)
    assert report["router"] == live.url
    assert report["quantum"] == worker_quantum(live.worker_urls[0])
    assert report["quantum_source"] in ("workers", "set")
    bounds = report["bounds"]
    u = bounds["request_cost"]["value"]
    assert bounds["per_worker"]["tokens"] == 2 * (u + report["quantum"])
    assert bounds["across_workers"]["tokens"] == 2 * 2 * (u + report["quantum"])
    capacities = [w["capacity_tokens_per_s"] for w in bounds["workers"]]
    assert len(capacities) == 2 and all(c and c > 0 for c in capacities)
    assert bounds["across_workers"]["seconds"] == pytest.approx(
        bounds["across_workers"]["tokens"] / sum(capacities)
    )
    code, out, _ = cli(capsys, "tune", "quantum", "--max-request-cost", "1000")
    assert code == 0
    assert "gap bound per worker" in out and "1,000 (given" in out and " s" in out


def test_set_prints_before_and_after_and_reaches_every_worker(
    live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--url", live.url, "--token", live.token]
    code, out, err = cli(capsys, "tune", "quantum", "1000", "--worker", "4096", *args, "--json")
    assert code == 0, err
    data = as_json(out)
    assert (data["quantum"], data["worker_quantum"], data["quantum_source"]) == (1000, 4096, "set")
    assert "quantum" in data["before"]
    assert [worker_quantum(u) for u in live.worker_urls] == [1000.0, 1000.0]
    code, out, _ = cli(capsys, "tune", "quantum", "700", *args)
    assert code == 0
    assert "before" in out and "after" in out and "1,000" in out and "700" in out


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["0"], ExitCode.USAGE, "Q: expected a positive finite quantum"),
        (["nan"], ExitCode.USAGE, "Q: expected a positive finite quantum"),
        (["inf"], ExitCode.USAGE, "Q: expected a positive finite quantum"),
        (["abc"], ExitCode.USAGE, "valid number"),
        (["--worker", "0"], ExitCode.USAGE, "--worker: expected a positive quantum"),
        (["100", "--auto"], ExitCode.USAGE, "cannot be combined"),
        (["--auto", "--sweep"], ExitCode.USAGE, "cannot be combined"),
        (["--apply"], ExitCode.USAGE, "--apply goes with --sweep"),
        (["--auto"], ExitCode.USAGE, "a target is required"),
        (["--auto", "--target-jain", "2"], ExitCode.USAGE, "--target-jain"),
        (["--max-request-cost", "-1"], ExitCode.USAGE, "--max-request-cost"),
    ],
)
def test_nonsense_values_are_usage_errors(
    live: Live, capsys: pytest.CaptureFixture[str], args: list[str], code: int, message: str
) -> None:
    status, _, err = cli(capsys, "tune", "quantum", *args, "--url", live.url, "--token", "t")
    assert status == code
    assert message in err


def test_admin_token_missing_or_wrong(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "tune", "quantum", "300", "--url", live.url)
    assert code == ExitCode.USAGE
    assert "needs the router's admin token" in err and "--token" in err
    code, _, err = cli(capsys, "tune", "quantum", "300", "--url", live.url, "--token", "nope")
    assert code == ExitCode.ERROR
    assert "wrong admin token" in err
    code, _, err = cli(
        capsys, "tune", "quantum", "--auto", "--target-jain", "0.9", "--url", live.url
    )
    assert code == ExitCode.USAGE and "admin token" in err  # before any measuring


@pytest.mark.parametrize(
    "args",
    [
        ["quantum", "--url", CLOSED],
        ["quantum", "300", "--url", CLOSED, "--token", "t"],
        ["weight", "--url", CLOSED],
        ["quantum"],  # no --url and no run file
    ],
)
def test_unreachable_router_exits_3(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    code, out, err = cli(capsys, "tune", *args)
    assert code == ExitCode.UNAVAILABLE
    assert out == ""
    assert "unreachable" in err or "nothing is running" in err


def test_auto_without_contention_changes_nothing(
    live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    before = worker_quantum(live.worker_urls[0])
    args = ["--target-jain", "0.9", "--window", "0.2", "--settle", "0", "--max-steps", "2"]
    code, out, err = cli(
        capsys, "tune", "quantum", "--auto", *args, "--url", live.url, "--token", live.token
    )
    assert code == 0, err
    assert "no window had two backlogged clients" in err
    assert "Auto-tune decisions" in out and "hold" in out
    assert worker_quantum(live.worker_urls[0]) == before


# ---------------------------------------------------------------------- weights
def test_weight_set_and_show(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--url", live.url, "--token", live.token]
    # A name the router has never seen is a typo until --create says otherwise.
    code, out, err = cli(capsys, "tune", "weight", "alice", "2.5", *args, "--json")
    assert code == ExitCode.ERROR and out == ""
    assert "unknown client 'alice'" in err and "--create" in err
    code, out, err = cli(capsys, "tune", "weight", "alice", "2.5", "--create", *args, "--json")
    assert code == 0, err
    change = as_json(out)
    assert (change["client"], change["weight"], change["previous"]) == ("alice", 2.5, 1.0)
    assert set(change["workers"]) == set(live.worker_urls)
    code, out, _ = cli(capsys, "tune", "weight", "alice", *args, "--json")
    assert as_json(out)["weights"] == {"alice": 2.5}
    code, out, _ = cli(capsys, "tune", "weight", *args)
    assert code == 0 and "alice" in out and "2.50" in out
    code, _, err = cli(capsys, "tune", "weight", "alice", "0", *args)
    assert code == ExitCode.USAGE and "W: expected a positive finite weight" in err
    code, _, err = cli(capsys, "tune", "weight", "alice", "3", "--url", live.url)
    assert code == ExitCode.USAGE and "admin token" in err


# ---------------------------------------------------------------------- sweep
def test_sweep_json_rows_per_setting(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--grid", "256,8192", "--worker-grid", "1024,inf", "--json"]
    code, out, err = cli(capsys, *SWEEP, *args)
    assert code == 0, err
    data = as_json(out)
    settings = [(r["quantum"], r["worker_quantum"]) for r in data["rows"]]
    assert settings == [(256, 1024), (8192, 1024), (256, "inf"), (8192, "inf")]
    keys = {"tokens_per_s", "jain_index", "well_behaved_p99_s", "cache_hit_rate", "pareto"}
    assert all(keys <= set(r) for r in data["rows"])
    assert sum(r["recommended"] for r in data["rows"]) == 1
    assert data["recommended"] in data["rows"]
    assert (data["workload"], data["duration_s"], data["target_jain"]) == ("long-qa-s1", 10, 0.9)


def test_sweep_table_marks_the_front_and_the_pick(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, *SWEEP, "--grid", "256,8192", "--target-jain", "0.1")
    assert code == 0
    assert "★" in out and "pareto" in out and "recommended: Q^u" in out


def test_sweep_replays_a_recorded_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "recorded.jsonl"
    workload = resolve_workload("long-qa-s1")
    with trace.open("w", encoding="utf-8") as sink:
        writer = TraceWriter(sink, name="recorded", duration_s=10.0)
        for program in workload.programs(1, 10.0):
            for call in program.calls:
                writer.write(
                    program.client, program.app, program.start_s, call.prompt_key,
                    call.output_tokens,
                )  # fmt: skip
    code, out, err = cli(
        capsys, "tune", "quantum", "--sweep", "--trace", str(trace), "--grid", "512", "--json"
    )
    assert code == 0, err
    data = as_json(out)
    assert data["workload"] == "recorded" and len(data["rows"]) == 1
    assert data["rows"][0]["tokens_per_s"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--sweep needs one of --trace FILE or --workload"),
        (["--workload", "nope-no-such"], "unknown workload"),
        (["--workload", "judge", "--grid", "1,x"], "--grid: item 2"),
        (["--workload", "judge", "--policy", "lpm"], "has no quantum"),
        (["--workload", "judge", "--duration", "0"], "--duration"),
    ],
)
def test_sweep_usage_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = cli(capsys, "tune", "quantum", "--sweep", *args)
    assert code == ExitCode.USAGE
    assert message in err


def test_sweep_apply_sets_the_recommendation_live(
    live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--grid", "300,600", "--url", live.url, "--token", live.token, "--apply", "--json"]
    code, out, err = cli(capsys, *SWEEP, *args)
    assert code == 0, err
    data = as_json(out)
    picked = data["recommended"]["quantum"]
    assert data["applied"]["quantum"] == picked
    assert [worker_quantum(u) for u in live.worker_urls] == [picked, picked]
    code, _, err = cli(capsys, *SWEEP, "--grid", "300", "--apply", "--url", CLOSED, "--token", "t")
    assert code == ExitCode.UNAVAILABLE  # checked before the sweep runs
