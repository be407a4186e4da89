"""``fairserve router``'s queue and metrics flags reach the router; the Prometheus client
labels are capped (first names seen, clients-file names always, the rest as ``other``)."""

from __future__ import annotations

import inspect
import signal
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from fairserve.commands import router as command
from fairserve.router import config
from fairserve.router.accounting import Accounting, Usage
from fairserve.router.metrics import RouterMetrics
from tests.router.helpers import chat, get_json, post, sim_router
from tests.router.test_command import _router, router_process
from tests.worker.helpers import run, write_profile
from tests.worker.processes import http_json, stop, worker_process


def _service_by_client(text: str) -> dict[str, float]:
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return {
        s.labels["client"]: s.value
        for s in families["fairserve_router_client_service"].samples
        if s.name.endswith("_total")
    }


def test_client_labels_are_capped_with_an_other_bucket() -> None:
    accounting = Accounting({"vip": 1.0}, labels=2)  # the metrics read its label totals
    for name in ("a", "b", "c", "d", "vip", "other"):
        accounting.arrived(name, 0.0, 0.0)
        accounting.finished(name, "w", 0.0, Usage(4, 0, 3), 0.02, 0.01, 0.0)  # service 10
    accounting.arrived("e", 0.0, 0.0)
    accounting.ended("e", 0.0, "aborted")
    metrics = RouterMetrics(accounting)
    text = metrics.render({"clients": {}, "workers": [], "jain_index": 1.0}).decode()
    # a and b were first; c, d, e (and a client literally named "other") share "other".
    assert _service_by_client(text) == {"vip": 10.0, "a": 10.0, "b": 10.0, "other": 30.0}
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = {
        (s.labels["client"], s.labels["outcome"]): s.value
        for s in families["fairserve_router_requests"].samples
    }
    assert requests[("other", "finished")] == 3 and requests[("other", "aborted")] == 1
    latency = families["fairserve_router_request_latency_seconds"].samples
    buckets = {
        s.labels["le"]: s.value
        for s in latency
        if s.name.endswith("_bucket") and s.labels["client"] == "other"
    }
    assert buckets["0.01"] == 0 and buckets["0.025"] == 3 and buckets["+Inf"] == 3


def test_router_server_applies_the_label_cap() -> None:
    async def body() -> None:
        async with sim_router(1, metrics_max_clients=1) as (_, session, _):
            for client in ("a", "b", "c"):
                await post(
                    session, "/v1/chat/completions", chat(), headers={"X-Fairserve-Client": client}
                )
            async with session.get("/metrics") as resp:
                text = await resp.text()
            _, state = await _state(session)
        assert set(_service_by_client(text)) == {"a", "other"}
        assert set(state["clients"]) == {"a", "b", "c"}  # the state keeps every name

    run(body())


async def _state(session: aiohttp.ClientSession) -> tuple[int, Any]:
    return await get_json(session, "/fairserve/v1/state")


def test_command_defaults_match_the_config() -> None:
    defaults = {name: p.default for name, p in inspect.signature(command.router).parameters.items()}
    assert defaults["max_outstanding_per_worker"] == config.DEFAULT_MAX_OUTSTANDING
    assert defaults["metrics_max_clients"] == config.DEFAULT_METRICS_MAX_CLIENTS


def test_flags_reach_the_running_router(tmp_path: Path) -> None:
    profile = str(write_profile(tmp_path))
    with worker_process("--speed", "100", "--profile", profile) as (_, worker_url):
        flags = ["--router-queue", "on", "--max-outstanding-per-worker", "3"]
        flags += ["--metrics-max-clients", "0"]
        with router_process("--worker-url", worker_url, "--port", "0", *flags) as (proc, url, _):
            status, state = http_json(url + "/fairserve/v1/state")
            assert status == 200 and state["workers"][0]["router_queue"]["max_outstanding"] == 3
            request = urllib.request.Request(
                url + "/v1/completions",
                data=b'{"prompt": "hello", "max_tokens": 2}',
                headers={"Content-Type": "application/json", "X-Fairserve-Client": "zed"},
            )
            with urllib.request.urlopen(request, timeout=10) as resp:
                assert resp.status == 200
            with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
                assert set(_service_by_client(resp.read().decode())) == {"other"}
            assert stop(proc, signal.SIGTERM) == 0


def test_bad_flag_values_exit_2() -> None:
    import subprocess

    for flag, value in (("--max-outstanding-per-worker", "0"), ("--metrics-max-clients", "-1")):
        done = subprocess.run(_router("--worker-url", "http://127.0.0.1:9", flag, value),
                              capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        assert done.returncode == 2 and flag in done.stderr


def test_listening_beyond_loopback_is_said_out_loud() -> None:
    from fairserve.router.config import RouterConfig

    local = RouterConfig(worker_urls=("http://127.0.0.1:1",), host="127.0.0.1")
    assert local.exposure_warning() is None
    exposed = RouterConfig(worker_urls=("http://127.0.0.1:1",), host="0.0.0.0")
    warning = exposed.exposure_warning()
    assert warning is not None and "0.0.0.0" in warning and "no --clients file" in warning
    assert "admin writes are off" in warning


def test_a_router_queue_runs_justitia_on_a_clock_in_seconds() -> None:
    """The router sees no decode steps: Justitia's virtual time must advance with time."""
    from fairserve.router.config import RouterConfig
    from fairserve.router.service import ROUTER_JUSTITIA_STEPS_PER_S, build_queue_policy

    config = RouterConfig(worker_urls=("http://127.0.0.1:1",), policy="justitia")
    policy = build_queue_policy(config)
    assert policy.config.as_dict()["clock"] == "seconds"
    assert policy.config.as_dict()["steps_per_s"] == ROUTER_JUSTITIA_STEPS_PER_S
    chosen = RouterConfig(
        worker_urls=("http://127.0.0.1:1",),
        policy="justitia",
        policy_params={"clock": "seconds", "steps_per_s": 50.0},
    )
    assert build_queue_policy(chosen).config.as_dict()["steps_per_s"] == 50.0
