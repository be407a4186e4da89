"""Two simulated workers behind the real ``sglang-router`` (the PyPI package).

The point of an SGLang-compatible worker is that SGLang's own tooling can front it. This
test starts the Rust router as a subprocess on 127.0.0.1 in front of two ``fairserve
worker`` processes and checks that it registers both (it reads ``/health``,
``/server_info`` and ``/model_info``), that native and OpenAI requests, streamed or not,
come back intact, and that round-robin spread them over both workers.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.worker.helpers import write_profile
from tests.worker.processes import (
    free_port,
    http_json,
    spawn,
    stop,
    wait_http_ok,
    worker_process,
)

pytest.importorskip(
    "sglang_router", reason="sglang-router is not installed (pip install sglang-router)"
)


@pytest.fixture
def router(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """The router's URL and its two workers' URLs."""
    profile = str(write_profile(tmp_path))
    args = ("--speed", "50", "--profile", profile)
    with worker_process(*args) as (w1, url1), worker_process(*args) as (w2, url2):
        port, metrics_port = free_port(), free_port()
        log_path = tmp_path / "router.log"
        with log_path.open("w") as log:
            proc = spawn(
                [
                    sys.executable, "-m", "sglang_router.launch_router",
                    "--worker-urls", url1, url2,
                    "--host", "127.0.0.1", "--port", str(port),
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
                    "--policy", "round_robin",
                    "--log-level", "warn",
                    "--shutdown-grace-period-secs", "1",
                ],
                log,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http_ok(url + "/health", timeout_s=30)
            _wait_workers(url, 2)
            yield url, [url1, url2]
        finally:
            code = stop(proc)
            output = log_path.read_text()
            assert "panic" not in output.lower(), output
            assert code == 0, output
        for worker in (w1, w2):
            assert stop(worker) == 0
            assert worker.stderr is not None
            # The router's gRPC probe (an HTTP/2 preface) is answered, not logged as a crash.
            assert "Traceback" not in worker.stderr.read()


def _wait_workers(url: str, count: int, timeout_s: float = 30.0) -> None:
    """Workers register in the background after the router answers ``/health``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, listing = http_json(url + "/workers")
        healthy = [w for w in listing.get("workers", []) if w.get("is_healthy")]
        if status == 200 and len(healthy) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"router did not register {count} healthy workers: {listing}")


def _sse(url: str, body: dict[str, object]) -> list[object]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    events: list[object] = []
    with urllib.request.urlopen(request, timeout=10) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_requests_through_sglang_router_reach_both_workers(
    router: tuple[str, list[str]],
) -> None:
    url, workers = router
    for i in range(4):
        body = {"text": f"request {i}", "sampling_params": {"max_new_tokens": 3}, "rid": f"g{i}"}
        status, out = http_json(url + "/generate", body)
        assert status == 200, out
        assert out["meta_info"]["id"] == f"g{i}"
        assert out["meta_info"]["completion_tokens"] == 3
        assert len(out["text"].split()) == 3
    for _ in range(2):
        chat = {"model": "fairserve-sim", "messages": [{"role": "user", "content": "hi"}]}
        status, out = http_json(url + "/v1/chat/completions", {**chat, "max_tokens": 4})
        assert status == 200, out
        assert out["choices"][0]["finish_reason"] == "length"
        assert out["usage"]["completion_tokens"] == 4
        assert len(out["choices"][0]["message"]["content"].split()) == 4

    events = _sse(
        url + "/generate",
        {"text": "stream me", "stream": True, "sampling_params": {"max_new_tokens": 3}},
    )
    assert events[-1] == "[DONE]"
    assert events[-2]["meta_info"]["finish_reason"] == {"type": "length", "length": 3}  # type: ignore[index]
    events = _sse(url + "/v1/chat/completions", {**chat, "max_tokens": 2, "stream": True})
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]

    served = [http_json(w + "/fairserve/worker/state")[1]["engine"]["finished"] for w in workers]
    assert sum(served) == 8
    assert min(served) >= 2, served  # round-robin used both workers
