"""Plans are validated before anything starts: every mistake names the option or file."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fairserve.cluster.plan import LaunchOptions, build_plan
from fairserve.core.errors import ConfigError, FairserveError
from tests.worker.helpers import write_profile


def test_default_plan_has_two_sim_workers_on_distinct_ports(tmp_path: Path) -> None:
    profile = write_profile(tmp_path)
    plan = build_plan(LaunchOptions(engine="sim", port=0, profile=str(profile), quantum=64))
    assert plan.engine == "sim" and len(plan.workers) == 2
    assert len({w.port for w in plan.workers}) == 2
    argv = plan.workers[0].argv
    assert argv[argv.index("--profile") + 1] == str(profile.resolve())
    assert argv[argv.index("--quantum") + 1] == "64"
    assert plan.router.worker_urls == tuple(w.url for w in plan.workers)
    assert plan.router.admin_token and len(plan.router.admin_token) >= 32


def test_options_round_trip_through_the_file(tmp_path: Path) -> None:
    options = LaunchOptions(workers=3, worker_urls=["http://127.0.0.1:9"], speed=4.0)
    options.save(tmp_path / "launch.json")
    assert LaunchOptions.load(tmp_path / "launch.json") == options


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (LaunchOptions(engine="sim", profile="/no/such/profile.toml"), "/no/such/profile.toml"),
        (LaunchOptions(engine="sim", policy="fcfs", quantum=5), "fcfs has no quantum"),
        (LaunchOptions(engine="sim", gpus="0,1"), "--gpus: applies to --engine sglang"),
        (LaunchOptions(engine="sim", gpus="a"), "--gpus: expected GPU ids"),
        (LaunchOptions(workers=0), "--workers"),
        (LaunchOptions(worker_urls=["localhost:1"]), "expected http://HOST:PORT"),
        (LaunchOptions(engine="sglang"), "--model is required"),
    ],
)
def test_bad_options_are_config_errors(options: LaunchOptions, message: str) -> None:
    options.port = 0
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        build_plan(options)


def test_busy_port_is_reported_before_anything_starts() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(FairserveError, match="address already in use"):
            build_plan(LaunchOptions(engine="sim", port=port))
