"""``fairserve simulate``: the DESIGN §7 report, comparisons, plots, errors and exit codes.

Runs are short (20 simulated seconds of a built-in workload on two workers) so that each
test takes well under a second; the numbers themselves are the simulator's business
(tests/sim), here only what the command makes of them.
"""

from __future__ import annotations

import json
import math
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fairserve.commands.app import app, run
from fairserve.commands.docgen.tree import build
from fairserve.commands.errors import ExitCode
from fairserve.sched.registry import dispatchers, local_policies
from fairserve.sim.engine import BATCHING_DISCIPLINES, DEFAULT_BATCHING
from fairserve.sim.profile import DEFAULT_PROFILE, REPO_PROFILES_DIR
from fairserve.workloads import list_builtin, resolve_workload
from tests.cli.conftest import REPO, RunCli

WORKLOAD = "long-qa-s1"
SHORT = ("--workload", WORKLOAD, "--duration", "20")
CLIENT_KEYS = {
    "requests",
    "service",
    "service_rate",
    "latency_p50_s",
    "latency_p99_s",
    "ttft_p50_s",
    "ttft_p99_s",
}
WORKER_KEYS = {"requests", "cache_hit_rate", "busy_fraction"}
META = {"workload", "policy", "dispatch", "worker_count", "profile", "batching", "seed"}

SMALL_WORKLOAD = """\
name = "tiny"
description = "two constant clients"
duration_s = 30
seed = 7

[[clients]]
name = "alice"
rate_per_s = 4
input_tokens = 200
output_tokens = 20

[[clients]]
name = "bob"
rate_per_s = 2
input_tokens = 100
output_tokens = 40
"""


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``fairserve simulate ARGS`` in this process; (exit code, stdout, stderr)."""
    code = run(["simulate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def report(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, err = simulate(capsys, *SHORT, "--json", *args)
    assert code == ExitCode.OK, err
    data: dict[str, Any] = json.loads(out)
    return data


# ---------------------------------------------------------------------- the report
def test_json_has_every_design_key(capsys: pytest.CaptureFixture[str]) -> None:
    data = report(capsys, "--workers", "2")
    for key in ("tokens_per_s", "service_per_s", "requests_per_s"):
        assert data["throughput"][key] > 0
    assert 0 <= data["cache_hit_rate"] <= 1
    assert 0 < data["jain_index"] <= 1
    assert data["max_service_gap"] >= 0
    names = [c.name for c in resolve_workload(WORKLOAD).clients]
    assert list(data["clients"]) == names
    for client in data["clients"].values():
        assert set(client) >= CLIENT_KEYS
    assert sum(c["requests"] for c in data["clients"].values()) > 0
    assert len(data["workers"]) == 2
    for worker in data["workers"]:
        assert set(worker) >= WORKER_KEYS
        assert 0 <= worker["busy_fraction"] <= 1


def test_json_names_what_was_simulated(capsys: pytest.CaptureFixture[str]) -> None:
    data = report(capsys, "--workers", "1", "--policy", "vtc", "--dispatch", "round-robin")
    assert {k: data[k] for k in META} == {
        "workload": WORKLOAD,
        "policy": "vtc",
        "dispatch": "round-robin",
        "worker_count": 1,
        "profile": DEFAULT_PROFILE,
        "batching": DEFAULT_BATCHING,
        "seed": resolve_workload(WORKLOAD).seed,
    }
    assert data["duration_s"] == 20
    assert (data["quantum"], data["worker_quantum"]) == (None, None)  # neither has one
    assert len(data["workers"]) == 1


def test_default_quanta_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    data = report(capsys)
    assert (data["policy"], data["dispatch"]) == ("dlpm", "doubleq")
    assert data["quantum"] > 0 and data["worker_quantum"] > 0


def test_same_seed_same_json_other_seed_other_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    first = simulate(capsys, *SHORT, "--json", "--seed", "3")
    second = simulate(capsys, *SHORT, "--json", "--seed", "3")
    other = json.loads(simulate(capsys, *SHORT, "--json", "--seed", "4")[1])
    assert first == second
    assert json.loads(first[1])["seed"] == 3
    assert json.loads(first[1])["clients"] != other["clients"]


def test_default_seed_is_the_workloads(capsys: pytest.CaptureFixture[str]) -> None:
    seed = str(resolve_workload(WORKLOAD).seed)
    assert simulate(capsys, *SHORT, "--json") == simulate(capsys, *SHORT, "--json", "--seed", seed)


def test_options_reach_the_simulation(capsys: pytest.CaptureFixture[str]) -> None:
    profile = REPO_PROFILES_DIR / "h100-llama-2-7b.toml"
    data = report(
        capsys, "--quantum", "1024", "--worker-quantum", "inf", "--batching", "orca",
        "--profile", str(profile), "--drain",
    )  # fmt: skip
    assert (data["quantum"], data["worker_quantum"]) == (1024.0, "inf")
    assert (data["batching"], data["profile"], data["drain"]) == ("orca", "h100-llama-2-7b", True)
    assert data["duration_s"] >= 20  # drained past the arrivals' end


def test_workload_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(SMALL_WORKLOAD, encoding="utf-8")
    code, out, err = simulate(capsys, "--workload", str(path), "--json", "--workers", "1")
    assert code == ExitCode.OK, err
    data = json.loads(out)
    assert (data["workload"], data["seed"], data["duration_s"]) == ("tiny", 7, 30)
    assert list(data["clients"]) == ["alice", "bob"]


def test_tables_show_summary_clients_and_workers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = simulate(capsys, *SHORT)
    assert code == ExitCode.OK
    assert err == ""  # not a terminal: no progress bar
    for text in (
        "throughput (tokens/s)",
        "cache hit rate",
        "Jain's index",
        "max service gap",
        "max service gap, extend tokens",
        "DoubleQ Theorem 5.1",
    ):
        assert text in out
    for name in [c.name for c in resolve_workload(WORKLOAD).clients] + ["w0", "w1"]:
        assert name in out
    assert "{" not in out  # tables, not JSON


def test_subprocess_json_is_one_object_and_stderr_is_quiet(run_cli: RunCli) -> None:
    result = run_cli("simulate", *SHORT, "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    data = json.loads(result.stdout)
    assert data["workload"] == WORKLOAD and data["clients"]


def test_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    """stderr on a pseudo-terminal gets the bar; stdout (a pipe) still gets the tables."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    with subprocess.Popen(
        [sys.executable, "-m", "fairserve", "simulate", *SHORT],
        stdout=subprocess.PIPE,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env=env,
    ) as proc:
        os.close(follower)
        stdout, _ = proc.communicate(timeout=60)
        terminal = _drain(leader)
    assert proc.returncode == 0
    assert "simulated s" in terminal
    assert "throughput" in stdout.decode()


def _drain(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO once the other side is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


# ---------------------------------------------------------------------- comparisons
def test_compare_json_runs_every_pair_on_the_same_traffic(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = simulate(
        capsys, *SHORT, "--json", "--dispatch", "least-load",
        "--compare", "lpm/round-robin,vtc/client-rr,dlpm",
    )  # fmt: skip
    assert code == ExitCode.OK, err
    runs = json.loads(out)["runs"]
    assert [(r["policy"], r["dispatch"]) for r in runs] == [
        ("lpm", "round-robin"),
        ("vtc", "client-rr"),
        ("dlpm", "least-load"),  # a bare policy takes --dispatch
    ]
    assert {(r["workload"], r["seed"], r["duration_s"]) for r in runs} == {(WORKLOAD, 1, 20)}
    single = report(capsys, "--policy", "vtc", "--dispatch", "client-rr")
    assert runs[1] == single  # a run in a comparison is the same run alone


def test_compare_table_has_a_row_per_pair_and_marks_the_best(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pairs = "lpm/round-robin,vtc/client-rr,dlpm/doubleq"
    code, out, _ = simulate(capsys, *SHORT, "--compare", pairs)
    assert code == ExitCode.OK
    runs = json.loads(simulate(capsys, *SHORT, "--compare", pairs, "--json")[1])["runs"]
    labels = pairs.split(",")
    rows = {}
    for line in out.splitlines():
        words = line.split()
        if words and words[0] in labels:
            rows[words[0]] = line
    assert set(rows) == set(labels)  # one row per pair
    tokens = [r["throughput"]["tokens_per_s"] for r in runs]
    jain = [r["jain_index"] for r in runs]
    for label, token_rate, fairness in zip(labels, tokens, jain, strict=True):
        assert (f"{token_rate:,.0f} *" in rows[label]) == (token_rate == max(tokens)), label
        assert (f"{fairness:,.3f} *" in rows[label]) == (fairness == max(jain)), label
    assert "* best throughput / best Jain's index" in out


def test_quantum_in_a_comparison_goes_to_the_runs_that_take_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = simulate(capsys, *SHORT, "--json", "--quantum", "999", "--compare", "lpm,dlpm")
    assert code == ExitCode.OK
    assert [r["quantum"] for r in json.loads(out)["runs"]] == [None, 999.0]


# ---------------------------------------------------------------------- --param
def test_param_sets_a_registered_parameter_and_the_report_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ("--policy", "rpm", "--dispatch", "round-robin")
    default = report(capsys, *base)
    limited = report(capsys, *base, "--param", "rpm.limit_per_min=1")
    assert limited["conservation"]["rejected"] > default["conservation"]["rejected"]
    assert limited["params"] == {"rpm": {"limit_per_min": 1}}
    assert default["params"] == {}


def test_param_goes_to_the_runs_whose_policy_or_dispatcher_declares_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--compare", "vtc/round-robin,dlpm/doubleq", "--param", "dlpm.quantum=999")
    code, out, err = simulate(capsys, *SHORT, "--json", *args, "--param", "vtc.charge_cached=true")
    assert code == ExitCode.OK, err
    vtc, dlpm = json.loads(out)["runs"]
    assert vtc["params"] == {"vtc": {"charge_cached": True}} and vtc["quantum"] is None
    assert dlpm["params"] == {"dlpm": {"quantum": 999.0}} and dlpm["quantum"] == 999.0
    assert vtc["service_gap_bound"]["view"] == "client"  # charge_cached reached the policy


# ---------------------------------------------------------------------- plots
def test_plot_writes_a_png_and_says_where(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "run.png"
    code, out, err = simulate(capsys, *SHORT, "--json", "--plot", str(path))
    assert code == ExitCode.OK, err
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert str(path) in err.replace("\n", "")
    assert json.loads(out)["workload"] == WORKLOAD  # stdout stays pure JSON


def test_compare_plot_has_a_column_per_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    one, two = tmp_path / "one.png", tmp_path / "two.png"
    assert simulate(capsys, *SHORT, "--plot", str(one))[0] == ExitCode.OK
    assert simulate(capsys, *SHORT, "--compare", "lpm,dlpm,vtc", "--plot", str(two))[0] == 0
    assert _png_width(two) > _png_width(one)


def test_plot_without_matplotlib_fails_before_simulating(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    code, out, err = simulate(capsys, *SHORT, "--plot", str(tmp_path / "x.png"))
    assert code == ExitCode.ERROR
    assert "pip install 'fairserve[plot]'" in err
    assert out == ""  # no report: nothing was simulated


def _png_width(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[16:20], "big")


# ---------------------------------------------------------------------- listing
def test_list_workloads_json_is_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = simulate(capsys, "--list-workloads", "--json")
    assert code == ExitCode.OK
    assert json.loads(out) == [{"name": n, "description": d} for n, d in list_builtin()]


def test_list_workloads_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = simulate(capsys, "--list-workloads")
    assert code == ExitCode.OK
    for name, _description in list_builtin():
        assert name in out


def test_choices_come_from_the_registries() -> None:
    """Completions and man pages list exactly the registered names."""
    (command,) = [c for c in build(app, "fairserve").subcommands if c.path[-1] == "simulate"]
    choices = {p.name: p.choices for p in command.options}
    assert list(choices["policy"]) == local_policies()
    assert list(choices["dispatch"]) == dispatchers()
    assert choices["batching"] == BATCHING_DISCIPLINES


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--workload", "nope"), ExitCode.USAGE, "unknown workload 'nope'; expected one of"),
        (("--workload", "missing.toml"), ExitCode.USAGE, "missing.toml"),
        ((*SHORT, "--profile", "nope"), ExitCode.USAGE, "unknown profile 'nope'"),
        ((*SHORT, "--policy", "nope"), ExitCode.USAGE, "unknown policy 'nope'"),
        ((*SHORT, "--dispatch", "nope"), ExitCode.USAGE, "unknown dispatcher 'nope'"),
        ((*SHORT, "--batching", "nope"), ExitCode.USAGE, "unknown batching discipline"),
        ((*SHORT, "--policy", "lpm", "--quantum", "5"), ExitCode.USAGE, "policy lpm has no"),
        ((*SHORT, "--dispatch", "client-rr", "--worker-quantum", "5"), 2, "client-rr has no"),
        ((*SHORT, "--quantum", "-1"), ExitCode.USAGE, "parameter 'quantum' must be > 0"),
        ((*SHORT, "--compare", "lpm,vtc", "--quantum", "5"), 2, "policies lpm, vtc have no"),
        ((*SHORT, "--compare", "lpm,dlpm/"), ExitCode.USAGE, "item 2 'dlpm/'"),
        ((*SHORT, "--compare", "lpm/nope"), ExitCode.USAGE, "item 1 'lpm/nope'"),
        ((*SHORT, "--workers", "0"), ExitCode.USAGE, "--workers"),
        (("--workload", WORKLOAD, "--duration", "0"), ExitCode.USAGE, "--duration"),
        ((), ExitCode.USAGE, "--workload is required"),
        ((*SHORT, "--plot", "out.nope"), ExitCode.USAGE, "out.nope"),
        ((*SHORT, "--param", "dlpm.fill_patience"), 2, "--param 'dlpm.fill_patience': expected"),
        ((*SHORT, "--param", "fill_patience=3"), 2, "--param 'fill_patience=3': expected"),
        ((*SHORT, "--param", "nope.x=1"), 2, "unknown policy or dispatcher 'nope'"),
        ((*SHORT, "--param", "dlpm.nope=1"), 2, "policy dlpm: unknown parameter(s) nope"),
        ((*SHORT, "--param", "dlpm.fill_patience=x"), 2, "'fill_patience' must be an integer"),
        ((*SHORT, "--param", "dlpm.fill_patience=-1"), 2, "'fill_patience' must be >= 0"),
        ((*SHORT, "--param", "vtc.charge_cached=maybe"), 2, "must be true or false"),
        ((*SHORT, "--param", "vtc.memory_patience=3"), 2, "no run uses policy vtc"),
        ((*SHORT, "--param", "doubleq.worker_quantum=0"), 2, "'worker_quantum' must be > 0"),
        ((*SHORT, "--quantum", "5", "--param", "dlpm.quantum=6"), 2, "given twice"),
    ],
)
def test_errors_and_exit_codes(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], code: int, message: str
) -> None:
    status, out, err = simulate(capsys, *args)
    assert status == code
    assert out == ""
    assert message in " ".join(err.replace("│", " ").split())
    assert "Traceback" not in err


def test_reports_are_finite_json(capsys: pytest.CaptureFixture[str]) -> None:
    """No NaN/inf sneaks into the report (Output refuses them; the user would get an error)."""
    data = report(capsys, "--workers", "1", "--duration", "2")
    stack: list[Any] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float):
            assert math.isfinite(item)


def test_simulate_predicts_the_workers_launch_starts(capsys: pytest.CaptureFixture[str]) -> None:
    """``simulate`` runs its workers with the running bound ``launch``'s workers use (the
    profile's default, :func:`fairserve.sim.running_bound.default_running_requests`), so what it
    predicts is what the service does. Unbounded, the README's showcase workload finished
    nothing in 20 s (every request in one batch of steps seconds long) while the live
    workers finished ~20 requests a second."""
    from fairserve.sim.profile import resolve_profile
    from fairserve.worker.config import WorkerConfig

    profile = resolve_profile(DEFAULT_PROFILE)
    bound = WorkerConfig(profile=profile).engine_config().max_running_requests
    code, out, err = simulate(capsys, "--workload", "vtc-constant", "--duration", "20", "--json")
    assert code == ExitCode.OK, err
    data = json.loads(out)
    finished = sum(c["requests"] for c in data["clients"].values())
    assert finished >= 200, data["clients"]
    assert data["max_running_requests"] == bound
