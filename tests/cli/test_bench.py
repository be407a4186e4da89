"""``fairserve bench`` through the CLI entry point: JSON, tables, plots and exit codes.

The worker runs in a thread with its own event loop, because the command runs
``asyncio.run`` itself, as it does for users.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairserve.commands.app import run
from fairserve.commands.errors import ExitCode
from tests.bench.helpers import scripted_upstream, single, worker_thread
from tests.worker.helpers import run as run_async
from tests.worker.processes import free_port

WORKLOAD = f'name = "cli-bench"\nduration_s = 0.6\nseed = 2\n{single("alice", 5)}{single("bob", 5)}'


@pytest.fixture(scope="module")
def worker_url() -> Iterator[str]:
    with worker_thread() as url:
        yield url


@pytest.fixture
def workload_file(tmp_path: Path) -> Path:
    path = tmp_path / "load.toml"
    path.write_text(WORKLOAD, encoding="utf-8")
    return path


def test_json_report_parses(
    worker_url: str, workload_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(["bench", "--url", worker_url, "-w", str(workload_file), "--json", "--api", "chat"])
    captured = capsys.readouterr()
    assert code == ExitCode.OK, captured.err
    report = json.loads(captured.out)
    assert report["api"] == "chat" and report["workload"] == "cli-bench"
    assert {c: report["clients"][c]["requests"] for c in ("alice", "bob")} == {
        "alice": 3,
        "bob": 3,
    }
    assert report["errors"]["total"] == 0


def test_table_and_plot(
    worker_url: str, workload_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "bench.png"
    args = ["bench", "--url", worker_url, "-w", str(workload_file), "--plot", str(plot)]
    code = run([*args, "--duration", "0.3", "--api", "generate"])
    captured = capsys.readouterr()
    assert code == ExitCode.OK, captured.err
    assert "Jain (weighted" in captured.out and "alice" in captured.out and "bob" in captured.out
    assert "arrivals for 0.3 s (--duration), then up to 30.0 s (--timeout)" in captured.out
    assert plot.stat().st_size > 0 and f"plot written to {plot}" in captured.err


def test_unreachable_url_exits_3(workload_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code = run(["bench", "--url", url, "-w", str(workload_file), "--json"])
    captured = capsys.readouterr()
    assert code == ExitCode.UNAVAILABLE
    assert f"cannot reach {url}" in captured.err and captured.out == ""


def test_bad_api_and_unknown_workload_are_usage_errors(
    worker_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["bench", "--url", worker_url, "-w", "x.toml", "--api", "nope"]) == 2
    assert "unknown API 'nope'" in capsys.readouterr().err
    assert run(["bench", "--url", worker_url, "-w", "no-such-workload"]) == ExitCode.USAGE


def test_a_run_where_nothing_succeeds_fails_after_reporting(
    workload_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refusing = workload_file.with_name("refused.toml")
    refusing.write_text(
        f'name = "refused"\nduration_s = 0.3\n{single("bob", 10)}', encoding="utf-8"
    )

    async def body() -> int:
        import asyncio

        async with scripted_upstream() as upstream:  # answers bob with 429
            argv = ["bench", "--url", upstream.url, "-w", str(refusing), "--json"]
            return await asyncio.to_thread(run, argv)

    code = run_async(body())
    captured = capsys.readouterr()
    assert code == ExitCode.ERROR
    assert json.loads(captured.out)["errors"]["by_status"] == {"http_429": 3}
    assert "no request succeeded (http_429)" in captured.err


def test_the_progress_bar_says_when_it_drains(tmp_path: Path, fairserve_exe: Path) -> None:
    """On a terminal, once arrivals stop the bar says it waits for calls in flight and for
    how long (before, ``--duration 20`` sat at 20/20 s for half a minute, unexplained)."""
    import os
    import pty
    import subprocess

    from tests.worker.processes import read_ready_url, spawn, worker_command

    workload = tmp_path / "slow.toml"
    workload.write_text(
        'name = "slow"\nduration_s = 1\nseed = 1\n[[clients]]\nname = "alice"\n'
        'arrival = "uniform"\nrate_per_s = 4\ninput_tokens = 8\noutput_tokens = 400\n'
    )
    worker = spawn(worker_command("--port", "0", "--speed", "1"))
    master, slave = pty.openpty()
    try:
        url = read_ready_url(worker)
        bench = subprocess.run(
            [str(fairserve_exe), "bench", "--url", url, "-w", str(workload),
             "--duration", "0.5", "--timeout", "1.5"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
            env={**os.environ, "COLUMNS": "200"}, timeout=60, check=False,
        )  # fmt: skip
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the pty's other end is closed and drained
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
        worker.terminate()
        worker.wait(timeout=10)
    text = seen.decode(errors="replace")
    assert "draining (up to 1.5 s, --timeout)" in text
    # 400 tokens take ~6 s: nothing finished, which is said as such (exit 1), not as errors.
    assert bench.returncode == 1
    assert "no request finished: all 2 were still open when the run ended" in text
