"""Router overhead benchmark: requests/s and latency with instant upstreams.

Same load, same run, three paths to two upstreams that answer a fixed small completion at
once (a minimal aiohttp OpenAI-compatible server, each in its own process):

* ``direct``: the load generator spreads requests over the upstreams itself;
* ``fairserve``: through ``fairserve router`` (a subprocess, its default dispatch);
* ``sglang-router``: through the real ``sglang_router`` (Rust, PyPI), round robin.

Reported: requests/s at fixed concurrency, p50/p99 latency, and ratios (router / direct,
fairserve / sglang-router), plus the latency each router adds at p50. Run::

    python tests/perf/bench_router.py [--concurrency 32] [--duration 5] [--json]

Not a test: nothing here asserts a speed (DESIGN §8 targets: at least sglang-router's
requests/s, under 1 ms added p50).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # runnable as a script: the shared test helpers
    sys.path.insert(0, str(ROOT))

from tests.worker.processes import free_port, wait_http_ok  # noqa: E402

ANSWER = {
    "id": "cmpl-bench",
    "object": "text_completion",
    "created": 0,
    "model": "bench",
    "choices": [{"index": 0, "text": " ok ok ok ok", "logprobs": None, "finish_reason": "length"}],
    "usage": {
        "prompt_tokens": 8,
        "completion_tokens": 4,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 0},
    },
}
REQUEST = {
    "model": "bench",
    "prompt": "Say something short about fair scheduling.",
    "max_tokens": 4,
}


# ------------------------------------------------------------------ upstream (own process)
def serve_upstream(port: int) -> None:
    from aiohttp import web

    answer = json.dumps(ANSWER).encode()
    info = json.dumps(
        {"model_path": "bench", "max_total_num_tokens": 100000, "is_generation": True}
    ).encode()
    models = json.dumps({"object": "list", "data": [{"id": "bench", "object": "model"}]}).encode()

    def fixed(body: bytes) -> Any:
        async def handle(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(body=body, content_type="application/json")

        return handle

    app = web.Application()
    app.add_routes(
        [
            web.post("/v1/completions", fixed(answer)),
            web.post("/v1/chat/completions", fixed(answer)),
            web.get("/health", fixed(b"{}")),
            web.get("/v1/models", fixed(models)),
            *[web.get(p, fixed(info)) for p in ("/get_server_info", "/server_info")],
            *[web.get(p, fixed(info)) for p in ("/get_model_info", "/model_info")],
        ]
    )
    _uvloop()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def _uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


# ------------------------------------------------------------------ processes
CLI_DIR = Path(__file__).resolve().parents[2] / "cli"


@contextlib.contextmanager
def process(
    argv: list[str], health_url: str, cli_dir: Path = CLI_DIR
) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(cli_dir)}
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=env,
    )  # fmt: skip
    try:
        wait_http_ok(health_url, timeout_s=30.0)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_sglang_workers(url: str, count: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(url + "/workers", timeout=1.0) as resp:
                listing = json.loads(resp.read())
            if len([w for w in listing.get("workers", []) if w.get("is_healthy")]) >= count:
                return
        time.sleep(0.2)
    raise RuntimeError("sglang-router did not register the workers")


# ------------------------------------------------------------------ load
async def load(
    urls: list[str], concurrency: int, duration_s: float, warmup_s: float
) -> dict[str, Any]:
    import aiohttp

    body = json.dumps(REQUEST).encode()
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        measure_from = start + warmup_s
        stop_at = measure_from + duration_s

        async def worker(i: int) -> None:
            nonlocal errors
            n = i
            while True:
                t0 = time.perf_counter()
                if t0 >= stop_at:
                    return
                url = urls[n % len(urls)] + "/v1/completions"
                n += 1
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    ok = resp.status == 200
                t1 = time.perf_counter()
                if t0 >= measure_from:
                    if ok:
                        latencies.append(t1 - t0)
                    else:
                        errors += 1

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    latencies.sort()
    n = len(latencies)
    return {
        "requests_per_s": n / duration_s,
        "p50_ms": latencies[n // 2] * 1e3 if n else None,
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1e3 if n else None,
        "requests": n,
        "errors": errors,
    }


def measure(urls: list[str], args: argparse.Namespace) -> dict[str, Any]:
    _uvloop()
    return asyncio.run(load(urls, args.concurrency, args.duration, args.warmup))


def measure_fairserve(upstreams: list[str], args: argparse.Namespace, cli: Path) -> dict[str, Any]:
    port = free_port()
    fair = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "fairserve", "router", "--port", str(port),
            "--dispatch", args.dispatch, "--router-queue", args.router_queue]  # fmt: skip
    for url in upstreams:
        argv += ["--worker-url", url]
    with process(argv, fair + "/health", cli.resolve()):
        return measure([fair], args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=5.0, help="Measured seconds per case.")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--dispatch", default="doubleq", help="fairserve router --dispatch.")
    parser.add_argument(
        "--router-queue",
        choices=("auto", "on", "off"),
        default="auto",
        help="fairserve router --router-queue (the bench upstreams have no fairserve "
        "extension, so auto means on; off shows the router without its fair queue).",
    )
    parser.add_argument(
        "--compare-cli",
        type=Path,
        metavar="DIR",
        help="Also run fairserve from another source tree (e.g. the previous commit's cli/) "
        "as case fairserve-base, in the same run.",
    )
    parser.add_argument("--skip-sglang", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return 0
    results: dict[str, Any] = {}
    me = [sys.executable, str(Path(__file__).resolve())]
    ports = [free_port(), free_port()]
    upstreams = [f"http://127.0.0.1:{p}" for p in ports]
    with contextlib.ExitStack() as stack:
        for port, url in zip(ports, upstreams, strict=True):
            stack.enter_context(process([*me, "--serve-upstream", str(port)], url + "/health"))
        results["direct"] = measure(upstreams, args)
        if args.compare_cli is not None:
            results["fairserve-base"] = measure_fairserve(upstreams, args, args.compare_cli)
        results["fairserve"] = measure_fairserve(upstreams, args, CLI_DIR)
        if not args.skip_sglang:
            port, metrics_port = free_port(), free_port()
            sgl = f"http://127.0.0.1:{port}"
            argv_sgl = [
                sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *upstreams,
                "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
                "--prometheus-port", str(metrics_port), "--policy", "round_robin",
                "--log-level", "warn",
            ]  # fmt: skip
            with process(argv_sgl, sgl + "/health"):
                wait_sglang_workers(sgl, 2)
                results["sglang-router"] = measure([sgl], args)
    report = _with_ratios(results, args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 0


def _with_ratios(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    direct = results["direct"]
    ratios: dict[str, Any] = {}
    for name in ("fairserve-base", "fairserve", "sglang-router"):
        if name in results and direct["requests_per_s"]:
            r = results[name]
            ratios[f"{name}/direct rps"] = r["requests_per_s"] / direct["requests_per_s"]
            ratios[f"{name} added p50 ms"] = r["p50_ms"] - direct["p50_ms"]
    if "sglang-router" in results and results["sglang-router"]["requests_per_s"]:
        ratios["fairserve/sglang-router rps"] = (
            results["fairserve"]["requests_per_s"] / results["sglang-router"]["requests_per_s"]
        )
    if "fairserve-base" in results and results["fairserve-base"]["requests_per_s"]:
        ratios["fairserve/fairserve-base rps"] = (
            results["fairserve"]["requests_per_s"] / results["fairserve-base"]["requests_per_s"]
        )
    return {
        "concurrency": args.concurrency,
        "router_queue": args.router_queue,
        "duration_s": args.duration,
        "cpus": os.cpu_count(),
        "cases": results,
        "ratios": ratios,
    }


def _print(report: dict[str, Any]) -> None:
    print(f"concurrency {report['concurrency']}, {report['duration_s']} s per case, "
          f"{report['cpus']} CPUs, fairserve --router-queue {report['router_queue']}")  # fmt: skip
    print(f"{'case':15} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
    for name, r in report["cases"].items():
        print(f"{name:15} {r['requests_per_s']:9.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
              f"{r['errors']:7d}")  # fmt: skip
    for name, value in report["ratios"].items():
        print(f"{name:32} {value:8.3f}")


if __name__ == "__main__":
    sys.exit(main())
