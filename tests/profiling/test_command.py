"""``fairserve profile`` and ``profile show`` as users run them: real processes.

The must-show: against a ``fairserve worker`` subprocess configured with a known profile,
``fairserve profile --quick`` recovers c, a and b0 within 5% in well under a minute, and the
file it writes is read by the simulator (a short ``simulate``) and served by
``fairserve worker --profile FILE``.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fairserve.commands.app import run as run_cli
from fairserve.sim.profile import Profile, load_profile, resolve_profile, write_profile
from tests.cli.conftest import run_fairserve
from tests.profiling.helpers import truth_profile
from tests.worker.processes import http_json, worker_process

TRUTH = truth_profile(
    c_s=0.012, a_s_per_token=4e-5, b0_tokens=180, attention_s_per_token=2e-7,
    step_overhead_s=0.003, max_batch_tokens=4096, kv_capacity_tokens=100_000,
)  # fmt: skip


def fairserve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in its own process; a profile run may take longer than the default."""
    return run_fairserve(*args, env=env, timeout_s=90)


def fairserve_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in this process (cheap: for checks that need no separate process)."""
    capsys.readouterr()
    code = run_cli(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@dataclass(frozen=True)
class Measured:
    report: dict[str, Any]
    path: Path
    plot: Path
    elapsed_s: float


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Measured:
    """One quick profile of a worker running ``TRUTH`` at speed 50, shared by the tests."""
    tmp = tmp_path_factory.mktemp("profile")
    truth_file = write_profile(TRUTH, tmp / "truth.toml")
    out, plot = tmp / "measured.toml", tmp / "fit.png"
    with worker_process("--profile", str(truth_file), "--speed", "50") as (_, url):
        started = time.monotonic()
        done = fairserve(
            "profile", "--url", url, "--quick", "--out", str(out), "--json",
            "--plot", str(plot), "--step-overhead-s", "0.003",
        )  # fmt: skip
        elapsed_s = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    return Measured(json.loads(done.stdout), out, plot, elapsed_s)


def test_quick_profile_recovers_the_workers_coefficients(measured: Measured) -> None:
    profile = load_profile(measured.path)

    assert profile.c_s == pytest.approx(TRUTH.c_s, rel=0.05)
    assert profile.a_s_per_token == pytest.approx(TRUTH.a_s_per_token, rel=0.05)
    assert profile.b0_tokens == pytest.approx(TRUTH.b0_tokens, rel=0.05)
    assert profile.attention_s_per_token == pytest.approx(TRUTH.attention_s_per_token, rel=0.05)
    assert profile.step_overhead_s == TRUTH.step_overhead_s
    assert (profile.kv_capacity_tokens, profile.max_batch_tokens) == (100_000, 4096)
    assert profile.source == "simulated" and profile.engine == "sim"
    assert profile.gpu == "simulated"  # no NVML name for a simulated worker's GPU
    sweep_s = measured.report["sweep"]["wall_s"]
    assert sweep_s < 20.0, f"the quick sweep took {sweep_s:.1f} s"
    assert measured.elapsed_s < 45.0, f"fairserve profile --quick took {measured.elapsed_s:.1f} s"


def test_without_out_the_profile_goes_to_the_data_dir_and_is_found_by_name(
    tmp_path: Path,
) -> None:
    # Before: written into the source checkout's profiles/, from any directory.
    truth_file = write_profile(TRUTH, tmp_path / "truth.toml")
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "FAIRSERVE_PROFILES_DIR": ""}
    repo_profiles = sorted((Path(__file__).resolve().parents[2] / "profiles").iterdir())
    with worker_process("--profile", str(truth_file), "--speed", "50") as (_, url):
        done = fairserve("profile", "--url", url, "--quick", "--json", env=env)
    assert done.returncode == 0, done.stderr
    written = Path(json.loads(done.stdout)["path"])
    assert written.parent == tmp_path / "data" / "fairserve" / "profiles"
    assert written.is_file() and "use it with --profile" in done.stderr
    assert sorted((Path(__file__).resolve().parents[2] / "profiles").iterdir()) == repo_profiles
    shown = fairserve("profile", "show", written.stem, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["source"] == "simulated"


def test_json_report_carries_fit_sweep_and_observations(measured: Measured) -> None:
    report = measured.report
    assert report["path"] == str(measured.path)
    assert report["sweep"]["timing"] == "engine" and report["sweep"]["speed"] == 50.0
    assert report["fit"]["r2"] > 0.999
    assert len(report["fit"]["residuals_s"]) == report["fit"]["points"]
    assert len(report["observations"]) == report["fit"]["points"]
    assert {o["kind"] for o in report["observations"]} == {"prefill", "decode", "mixed"}
    assert report["profile"]["capacity"]["tokens_per_s"] == pytest.approx(
        TRUTH.capacity_tokens_per_s, rel=0.05
    )
    assert report["gpu"] is None  # no NVML here, or the worker is simulated: "n/a"


def test_plot_is_written(measured: Measured) -> None:
    assert measured.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_simulator_runs_on_the_measured_profile(
    measured: Measured, capsys: pytest.CaptureFixture[str]
) -> None:
    assert resolve_profile(str(measured.path)) == load_profile(measured.path)
    code, out, err = fairserve_here(
        capsys, "simulate", "--workload", "vtc-constant", "--profile", str(measured.path),
        "--duration", "5", "--workers", "1", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["throughput"]["tokens_per_s"] > 0


def test_a_worker_serves_the_measured_profile(measured: Measured) -> None:
    profile: Profile = load_profile(measured.path)
    with worker_process("--profile", str(measured.path), "--speed", "50") as (_, url):
        status, info = http_json(url + "/get_server_info")
        assert status == 200
        assert info["fairserve"]["profile"] == profile.name
        assert info["fairserve"]["capacity_tokens_per_s"] == pytest.approx(
            profile.capacity_tokens_per_s
        )
        status, body = http_json(
            url + "/generate", {"input_ids": [5] * 32, "sampling_params": {"max_new_tokens": 4}}
        )
        assert status == 200 and body["meta_info"]["completion_tokens"] == 4


SMALL_MIX = """
name = "small-mix"
duration_s = 20
seed = 1

[[clients]]
name = "a"
arrival = "uniform"
rate_per_s = 5
input_tokens = 200
output_tokens = 100
"""


def test_show_prints_coefficients_and_the_load_bound(
    measured: Measured, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    mix = tmp_path / "mix.toml"
    mix.write_text(SMALL_MIX, encoding="utf-8")
    code, out, err = fairserve_here(
        capsys, "profile", "show", str(measured.path), "--workload", str(mix), "--json"
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["batch_time"]["b0_tokens"] == load_profile(measured.path).b0_tokens
    assert summary["stability"]["load_tokens_per_s"] == pytest.approx(5 * 300)
    assert summary["stability"]["stable"] is True
    code, out, _ = fairserve_here(capsys, "profile", "show", str(measured.path), "-w", str(mix))
    assert code == 0
    assert "capacity" in out and "tokens/s" in out and "stable" in out


def test_show_by_name_finds_shipped_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = fairserve_here(capsys, "profile", "show", "h100-llama-2-7b", "--json")
    assert code == 0, err
    assert json.loads(out)["gpu"] == "NVIDIA H100 80GB HBM3"


def test_unreachable_worker_exits_3(tmp_path: Path) -> None:
    """A real process: the exit status a script sees."""
    done = fairserve("profile", "--url", "http://127.0.0.1:9", "--quick", "--out",
                     str(tmp_path / "x.toml"))  # fmt: skip
    assert done.returncode == 3
    assert "cannot reach worker http://127.0.0.1:9" in done.stderr
    assert not (tmp_path / "x.toml").exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("not toml at all", "invalid TOML"),
        ("[profile]\ngpu = 1\n", "missing field profile.model"),
    ],
)
def test_bad_profile_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, expected: str
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(content, encoding="utf-8")
    code, _, err = fairserve_here(capsys, "profile", "show", str(bad))
    assert code == 2
    assert str(bad) in err and expected in err
    assert "Traceback" not in err


def test_missing_profile_file_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = fairserve_here(capsys, "profile", "show", str(tmp_path / "gone.toml"))
    assert code == 2 and "profile file not found" in err


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = fairserve_here(capsys, "profile")
    assert code == 2 and "--url is required" in err
    code, _, err = fairserve_here(
        capsys, "profile", "--url", "http://127.0.0.1:9", "--timing", "psychic"
    )
    assert code == 2 and "psychic" in err
    existing = tmp_path / "taken.toml"
    existing.write_text("keep me", encoding="utf-8")
    code, _, err = fairserve_here(
        capsys, "profile", "--url", "http://127.0.0.1:9", "--out", str(existing)
    )
    assert code == 1 and "--force" in err
    assert existing.read_text(encoding="utf-8") == "keep me"
