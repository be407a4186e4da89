"""The auto-tuner against a live router and simulated workers (in-process, sped up).

The load (``tests.tuning.live``) makes fairness hinge on the quantum: a heavy client with
many request loops and a light one with a few. Started at a quantum far too large for the
target, the tuner must lower it, find a quantum whose measured window meets the target,
leave it in force on the router and every worker, and do so within its step limit.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from fairserve.api.admin_client import AdminClient
from fairserve.commands.app import run
from tests.tuning.live import HEAVY_LIGHT, live_cluster

TARGET = 0.9
START = 32768.0
MAX_STEPS = 8


def test_auto_tuner_reaches_a_quantum_meeting_the_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with live_cluster(load=HEAVY_LIGHT) as live:
        router = AdminClient(live.url, live.token)
        router.set_quantum(START)
        argv = ["tune", "quantum", "--auto", "--target-jain", str(TARGET)]
        argv += ["--min-quantum", "512", "--max-quantum", str(START), "--max-step", "4"]
        argv += ["--window", "1.6", "--settle", "0.6", "--max-steps", str(MAX_STEPS)]
        code = run([*argv, "--url", live.url, "--token", live.token, "--json"])
        captured = capsys.readouterr()
        print(captured.err)
        assert code == 0, captured.err
        result: dict[str, Any] = json.loads(captured.out)
        view = router.quantum()
        workers = [_worker_quantum(u) for u in live.worker_urls]
        served = dict(live.requests)

    assert served.get("heavy", 0) > served.get("light", 0) > 0, served
    decisions = result["decisions"]
    final = result["final_quantum"]
    assert 1 <= result["steps"] <= MAX_STEPS
    assert decisions[0]["quantum"] == START and decisions[0]["met"] is False, decisions[0]
    assert final < START
    meeting = [d for d in decisions if d["quantum"] == final and d["met"]]
    assert meeting, f"{final} was never measured meeting the target: {decisions}"
    assert all(d["observation"]["jain_index"] >= TARGET for d in meeting)
    assert view["quantum"] == final and view["quantum_source"] == "set"
    assert workers == [final] * len(live.worker_urls)
    assert "auto-tune to Jain ≥ 0.9" in captured.err  # the decision log went to stderr
    assert captured.err.count("step=") == result["steps"]


def _worker_quantum(url: str) -> float:
    """Q^u as the worker's own extension reports it (not the router's view)."""
    with urllib.request.urlopen(url + "/fairserve/worker/quantum", timeout=5) as resp:
        return float(json.loads(resp.read())["quantum"])
