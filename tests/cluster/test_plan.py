"""Plans are validated before anything starts: every mistake names the option or file."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fairserve.cluster.options import LaunchOptions
from fairserve.cluster.plan import LaunchPlan, build_plan, default_ready_timeout_s
from fairserve.core.errors import ConfigError, FairserveError
from fairserve.sglang.config import config_from_env
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
        (LaunchOptions(engine="sim", tp=2), "--tp: applies to --engine sglang"),
        (LaunchOptions(engine="sim", sglang_args=["--x"]), "-- SGLANG_ARGS: applies to"),
        (LaunchOptions(worker_urls=["http://127.0.0.1:9"], tp=2), "drop --engine/--tp"),
        (LaunchOptions(tp=0), "--tp"),
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


def sglang_plan(**changes: object) -> LaunchPlan:
    options = LaunchOptions(engine="sglang", model="org/model", gpus="0,1,2,3", port=0)
    for key, value in changes.items():
        setattr(options, key, value)
    return build_plan(options, dry_run=True)


def test_sglang_plan_one_server_per_gpu_group() -> None:
    plan = sglang_plan(tp=2, quantum=512.0, sglang_args=["--mem-fraction-static", "0.8"])
    assert plan.engine == "sglang" and [w.gpus for w in plan.workers] == [(0, 1), (2, 3)]
    ports = [w.port for w in plan.workers] + [w.extension_port for w in plan.workers]
    assert len(set(ports)) == 4
    first = plan.workers[0]
    argv = list(first.argv)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert argv[argv.index("--model-path") + 1] == "org/model"
    assert argv[argv.index("--port") + 1] == str(first.port)
    assert argv[argv.index("--tp-size") + 1] == "2"
    assert "--enable-metrics" in argv and argv[argv.index("--schedule-policy") + 1] == "lpm"
    assert argv[-2:] == ["--mem-fraction-static", "0.8"]
    env = dict(first.env)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["SGLANG_PLUGINS"] == "fairserve"
    assert env["FAIRSERVE_POLICY"] == "dlpm" and env["FAIRSERVE_QUANTUM"] == "512"
    assert env["FAIRSERVE_EXTENSION_PORT"] == str(first.extension_port)
    assert "FAIRSERVE_ADMIN_TOKEN" not in env  # passed by the supervisor, never planned
    assert plan.router.worker_urls == tuple(w.url for w in plan.workers)
    assert plan.extension_urls == {w.url: w.extension_url for w in plan.workers}
    assert first.extension_url == f"http://127.0.0.1:{first.extension_port}"


def test_the_plugin_environment_is_what_the_plugin_reads() -> None:
    plan = sglang_plan(policy="justitia")
    config = config_from_env(dict(plan.workers[0].env))
    assert config is not None and config.policy == "justitia"
    assert config.extension_port == plan.workers[0].extension_port


def test_a_given_schedule_policy_is_kept() -> None:
    argv = sglang_plan(sglang_args=["--schedule-policy", "fcfs"]).workers[0].argv
    assert argv.count("--schedule-policy") == 1 and argv[-1] == "fcfs"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sglang_args": ["--port", "1"]}, "-- --port: fairserve launch sets it"),
        ({"sglang_args": ["--tp-size=2"]}, "use --tp instead"),
        ({"sglang_args": ["--dp-size", "2"]}, "one server per GPU group"),
        ({"policy": "rpm"}, "cannot run inside SGLang"),
        ({"policy": "vtc", "quantum": 64.0}, "vtc has no quantum"),
        ({"gpus": "0,1,2", "tp": 2}, "do not split"),
    ],
)
def test_bad_sglang_options(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sglang_plan(**changes)


def test_sim_workers_get_no_extra_environment(tmp_path: Path) -> None:
    plan = build_plan(LaunchOptions(engine="sim", port=0, profile=str(write_profile(tmp_path))))
    assert all(w.env == () and w.extension_url == w.url for w in plan.workers)
    assert plan.extension_urls == {} and plan.ready_timeout_s == 60


def test_default_ready_timeouts() -> None:
    assert default_ready_timeout_s("sim", None) == 60
    assert default_ready_timeout_s("sglang", "m") == 900
    assert default_ready_timeout_s(None, None) == 60


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_trace_that_cannot_be_written_is_a_config_error(tmp_path: Path, dry_run: bool) -> None:
    """``--record`` is checked with the other options, before any worker starts (it was
    opened by the router after the workers were up: a bare ``[Errno 2]``, exit 1)."""
    for path, message in [
        (tmp_path / "no" / "such" / "trace.jsonl", "does not exist"),
        (tmp_path, "is a directory"),
    ]:
        with pytest.raises(ConfigError, match=f"--record .*{message}"):
            build_plan(LaunchOptions(engine="sim", port=0, record=str(path)), dry_run=dry_run)
    fine = tmp_path / "trace.jsonl"
    assert build_plan(LaunchOptions(engine="sim", port=0, record=str(fine))).router.trace_path
    assert not fine.exists()  # checked, not created: the router opens it
