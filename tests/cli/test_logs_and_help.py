"""Small things an operator trips over in the first hour: the router's help shows the
clients file's ``[[clients]]`` (rich markup used to eat it), and worker and router log lines
carry a timestamp, ejections included, so a log can be matched with what clients saw."""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.cli.conftest import RunCli
from tests.worker.processes import free_port, read_ready_url, spawn, worker_command

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "


def test_router_help_and_man_page_show_the_clients_table(run_cli: RunCli) -> None:
    shown = run_cli("router", "--help", env={"COLUMNS": "200"})
    assert shown.returncode == 0
    assert "TOML [[clients]] name, api_key, weight" in shown.stdout
    from fairserve.commands.docgen import generate

    page = generate()["man/fairserve-router.1"]
    assert "TOML [[clients]] name, api_key, weight" in page and "\\e[" not in page


def _lines_until(proc: subprocess.Popen[str], pattern: str, timeout_s: float) -> list[str]:
    """stderr lines of ``proc`` up to the first matching ``pattern`` (bounded in time)."""
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.1)
        if ready:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line.rstrip("\n"))
            if re.search(pattern, line):
                return seen
    raise AssertionError(f"no line matching {pattern!r} within {timeout_s} s: {seen}")


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def test_worker_and_router_lines_and_ejections_are_timestamped(fairserve_exe: Path) -> None:
    worker = spawn(worker_command("--port", "0"))
    router = None
    try:
        worker_url = read_ready_url(worker)
        port = free_port()
        router = spawn([str(fairserve_exe), "router", "--port", str(port),
                        "--worker-url", worker_url])  # fmt: skip
        ready = _lines_until(router, "listening on", 20.0)
        assert re.match(STAMP + "fairserve router listening on", ready[-1]), ready
        _stop(worker)  # the router's health checks eject it
        ejected = _lines_until(router, "ejected", 30.0)
        assert re.match(STAMP + r"fairserve router: WARNING: worker \S+ ejected", ejected[-1])
    finally:
        _stop(worker)
        if router is not None:
            _stop(router)
    worker_log = worker.stderr.read() if worker.stderr else ""
    assert re.search("^" + STAMP + "fairserve worker: shutting down", worker_log, re.M), worker_log


def test_worker_ready_line_is_timestamped() -> None:
    worker = spawn(worker_command("--port", "0"))
    try:
        assert worker.stderr is not None
        line = _lines_until(worker, "listening on", 20.0)[-1]
        assert re.match(STAMP + "fairserve worker listening on http://127.0.0.1:", line), line
    finally:
        _stop(worker)


def test_a_client_disconnect_is_not_a_traceback_in_the_worker_log() -> None:
    import asyncio

    import aiohttp

    worker = spawn(worker_command("--port", "0", "--speed", "1"))
    try:
        url = read_ready_url(worker)

        requests: list[tuple[str, dict[str, object]]] = [
            ("/v1/completions", {"prompt": "hello", "max_tokens": 500, "stream": True}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 500, "stream": True}),
            ("/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 500},
                           "stream": True}),
        ]  # fmt: skip

        async def leave_mid_stream() -> None:
            for path, payload in requests:
                async with (
                    aiohttp.ClientSession() as session,
                    session.post(url + path, json=payload) as resp,
                ):
                    await resp.content.readline()  # the stream has begun; now leave

        asyncio.run(asyncio.wait_for(leave_mid_stream(), 20))
        time.sleep(0.5)
    finally:
        _stop(worker)
    log = worker.stderr.read() if worker.stderr else ""
    assert "Traceback" not in log, log
    assert len(log.splitlines()) <= 4, log  # ready, shutting down, at most a line per event


def test_router_records_a_trace_under_launchs_option_name(
    fairserve_exe: Path, tmp_path: Path
) -> None:
    """``router --record`` is ``launch --record`` (an operator moving from one to the other
    keeps the flag); ``--trace``, the older name, still works."""
    worker = spawn(worker_command("--port", "0"))
    routers: list[subprocess.Popen[str]] = []
    try:
        worker_url = read_ready_url(worker)
        for flag in ("--record", "--trace"):
            trace, port = tmp_path / f"{flag[2:]}.jsonl", free_port()
            router = spawn([str(fairserve_exe), "router", "--port", str(port),
                            "--worker-url", worker_url, flag, str(trace)])  # fmt: skip
            routers.append(router)
            _lines_until(router, "listening on", 20.0)
            body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 2}).encode()
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions", data=body,
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=30) as answer:
                assert answer.status == 200
            _stop(router)
            lines = [json.loads(line) for line in trace.read_text().splitlines()]
            assert lines[0]["fairserve_trace"] == 1, flag
            assert len(lines) == 2 and lines[1]["client"] == "anonymous", (flag, lines)
    finally:
        _stop(worker)
        for router in routers:
            _stop(router)
