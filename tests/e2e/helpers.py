"""End-to-end rigs: real ``fairserve worker`` and ``fairserve router`` processes on loopback.

Every server is a subprocess (the CLI the operators run), so the two cores of a small CI
machine share the work between the workers, the router and the load generator in the test
process, and none of them steals the others' event loop.
"""

from __future__ import annotations

import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.worker.processes import http_json, spawn, stop, worker_process

ROUTER_READY = re.compile(r"fairserve router listening on (http://\S+)")

SPEED = 20.0
"""Simulated seconds per wall second: each worker runs 20x faster than the slow GPU below."""

# A deliberately slow simulated GPU so that, at SPEED, a worker saturates at a request rate
# the load generator, the router and two workers can sustain on two CPU cores. A full step
# of 512 tokens takes 0.2 + 2e-3 * (512 - 32) = 1.16 simulated s = 58 wall ms; a decode-only
# step 0.2 s = 10 wall ms. One worker does ~441 tokens per simulated second, ~8.8k per wall
# second.
PROFILE_TOML = """\
[profile]
gpu = "E2E slow GPU"
model = "test/model"
engine = "sglang"
date = "2026-01-02"
source = "synthetic"
provenance = "slow profile for the end-to-end fairness test"

[batch_time]
c_s = 0.2
a_s_per_token = 2e-3
b0_tokens = 32
attention_s_per_token = 0.0
step_overhead_s = 0.0

[capacity]
kv_capacity_tokens = 16384
max_batch_tokens = 512
"""


@dataclass(frozen=True)
class Stack:
    """A router in front of two workers: its URL and the configuration it runs."""

    url: str
    dispatch: str
    worker_policy: str


def write_profile(directory: Path) -> Path:
    path = directory / "e2e-slow.toml"
    path.write_text(PROFILE_TOML, encoding="utf-8")
    return path


def router_command(worker_urls: list[str], dispatch: str, policy: str) -> list[str]:
    argv = [sys.executable, "-m", "fairserve", "router", "--port", "0"]
    for url in worker_urls:
        argv += ["--worker-url", url]
    return [*argv, "--dispatch", dispatch, "--policy", policy]


def read_router_url(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> str:
    """The URL from the router's ready line on stderr (fails if it exits or stays silent)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stderr], [], [], 0.1)
        if not ready:
            continue
        line = proc.stderr.readline()
        seen.append(line)
        match = ROUTER_READY.search(line)
        if match:
            return match.group(1)
    raise AssertionError(f"router not ready (exit {proc.poll()}): {''.join(seen)}")


@contextmanager
def router_process(worker_urls: list[str], dispatch: str, policy: str) -> Iterator[str]:
    proc = spawn(router_command(worker_urls, dispatch, policy))
    try:
        yield read_router_url(proc)
    finally:
        stop(proc)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@contextmanager
def serving_stack(
    profile: Path, dispatch: str, worker_policy: str, workers: int = 2
) -> Iterator[Stack]:
    """``workers`` simulated workers running ``worker_policy``, a router dispatching with
    ``dispatch`` in front of them (its own queue stays off: the workers are fair inside)."""
    with ExitStack() as stack:
        urls = []
        for _ in range(workers):
            _, url = stack.enter_context(
                worker_process(
                    "--speed", str(SPEED), "--policy", worker_policy, "--profile", str(profile)
                )
            )
            urls.append(url)
        url = stack.enter_context(router_process(urls, dispatch, worker_policy))
        yield Stack(url, dispatch, worker_policy)


def router_state(url: str) -> dict[str, Any]:
    status, state = http_json(url + "/fairserve/v1/state")
    assert status == 200, f"GET /fairserve/v1/state: {status} {state}"
    assert isinstance(state, dict)
    return state
