"""Router memory: bytes per tracked prefix token in its trees, and its RSS over many prompts.

Two measurements, both against instant upstreams on 127.0.0.1 (``bench_router``'s):

``tree``: a :class:`~fairserve.router.service.Router` in this process, started as
``fairserve router`` starts it (its dispatcher's global tree, one fair queue and prefix tree
per stock worker, built when the health probe finds the worker), serves ``--prompts``
distinct prompts through its own request path (``prepare_call`` then ``proxy.serve``, over
HTTP to the upstreams) under ``tracemalloc``. The upstreams report a KV capacity larger than
what is sent, so nothing is evicted. Reported: all the memory the router still holds
afterwards (the requests are gone: it is the trees, and per-client state for one client),
per prefix token the trees track (the global tree's plus every fair queue's, from the
router's state document) and per request; and the part allocated by the tree code itself
(allocations with a frame in ``core/radix*``, ``core/prefix*``, ``sched/dispatch`` or
``router/fairqueue``: a prompt key a tree keeps whole is the parser's bytes object, shared
by both trees, and counted only in the first figure).

``rss``: a real ``fairserve router`` process with its default options, fed ``--requests``
distinct prompts over HTTP by a closed-loop load of ``--concurrency`` clients; its resident
set size (psutil, children included) and its trees' tokens (``GET /fairserve/v1/state``)
every ``--every`` requests, and the slope over the second half. Bounded by
``--time-limit-s``: the last count reached is what is reported. The upstreams report
``--kv-tokens`` of KV capacity (0: none, as a worker that does not say).

Not a test: nothing asserts a size. Run::

    python tests/perf/mem_router.py tree [--prompts 20000] [--prompt-words 200]
    python tests/perf/mem_router.py rss [--requests 1000000] [--prompt-words 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # runnable as a script: the shared test helpers
    sys.path.insert(0, str(ROOT))

from tests.perf import bench_router as bench  # noqa: E402
from tests.worker.processes import free_port  # noqa: E402

TREE_CODE = ("*/core/radix*", "*/core/prefix*", "*/sched/dispatch/*", "*/router/fairqueue.py")
"""Where the trees allocate: what ``tree`` counts as tree memory."""
STATE_PATH = "/fairserve/v1/state"
RSS_KV_TOKENS = 1 << 20
"""KV capacity the ``rss`` upstreams report by default: about an 8B model's on one 80 GB
GPU, and the router's own assumption for a worker that reports none."""


# ------------------------------------------------------------------ upstreams
def upstreams(stack: contextlib.ExitStack, kv_tokens: int) -> list[str]:
    """Two lean instant upstreams reporting ``kv_tokens`` of KV capacity, running until
    ``stack`` ends: their URLs."""
    me = [sys.executable, str(Path(bench.__file__).resolve()), "--harness", "lean"]
    urls = []
    for _ in range(2):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = [*me, "--serve-upstream", str(port), "--upstream-kv-tokens", str(kv_tokens)]
        stack.enter_context(bench.process(argv, url + "/health"))
        urls.append(url)
    return urls


def tracked_tokens(state: dict[str, Any]) -> dict[str, int]:
    """Prefix tokens the router's trees track, from its state document: the dispatcher's
    global tree and every worker's fair-queue tree."""
    global_tokens = state["dispatcher"].get("tree_tokens") or 0
    queues = [w["router_queue"] for w in state["workers"] if w.get("router_queue")]
    local_tokens = sum(q.get("cache_tokens") or 0 for q in queues)
    return {"global": int(global_tokens), "local": int(local_tokens)}


# ------------------------------------------------------------------ tree: in process
class _Discard:
    """A :class:`~fairserve.router.answer.Responder` that keeps nothing."""

    def answer(self, status: int, body: bytes) -> None:
        if status != 200:
            raise RuntimeError(f"router answered {status}: {body[:200]!r}")

    async def open_stream(self) -> None:
        return None

    async def write(self, data: bytes) -> None:
        return None

    async def write_eof(self) -> None:
        return None


async def _serve_in_process(
    router: Any, bodies: bench.Bodies, first: int, count: int, concurrency: int
) -> None:
    """Requests ``first .. first + count - 1`` through the router's own request path."""
    from fairserve.router import handlers, proxy

    headers = {"Content-Type": "application/json"}
    numbers = iter(range(first, first + count))

    async def client() -> None:
        for n in numbers:
            call = handlers.prepare_call(router, "completions", headers, bodies(n))
            await proxy.serve(router, call, _Discard())

    await asyncio.gather(*(client() for _ in range(concurrency)))


async def _tree(args: argparse.Namespace, urls: list[str]) -> dict[str, Any]:
    from fairserve.router import state
    from fairserve.router.config import RouterConfig
    from fairserve.router.service import Router

    router = Router(RouterConfig(worker_urls=tuple(urls)))
    await router.start()
    try:
        bodies = bench.request_bodies(args.prompt_words, True)
        await _serve_in_process(router, bodies, 1, args.warmup, args.concurrency)
        before_tokens = tracked_tokens(state.snapshot(router))
        gc.collect()
        tracemalloc.start(args.frames)
        base = tracemalloc.take_snapshot()
        base_total = tracemalloc.get_traced_memory()[0]
        start_s = time.perf_counter()
        first = args.warmup + 1
        await _serve_in_process(router, bodies, first, args.prompts, args.concurrency)
        elapsed_s = time.perf_counter() - start_s
        gc.collect()
        total = tracemalloc.get_traced_memory()[0] - base_total
        snap = tracemalloc.take_snapshot()
        tracemalloc.stop()
        after_tokens = tracked_tokens(state.snapshot(router))
    finally:
        await router.close()
        for up in router.upstreams.values():
            if up.pool is not None:
                up.pool.close()
    filters = [tracemalloc.Filter(True, pattern, all_frames=True) for pattern in TREE_CODE]
    tree_bytes = sum(d.size_diff for d in snap.filter_traces(filters).compare_to(
        base.filter_traces(filters), "filename"))  # fmt: skip
    tokens = {k: after_tokens[k] - before_tokens[k] for k in after_tokens}
    tracked = tokens["global"] + tokens["local"]
    return {
        "prompts": args.prompts,
        "prompt_words": args.prompt_words,
        "tracked_tokens": tokens,
        "tree_bytes": tree_bytes,
        "tree_bytes_per_tracked_token": tree_bytes / tracked if tracked else None,
        "router_bytes_kept": total,
        "router_bytes_kept_per_tracked_token": total / tracked if tracked else None,
        "router_bytes_kept_per_request": total / args.prompts,
        "seconds_traced": elapsed_s,
        "kv_tokens_reported": args.kv_tokens,
    }


# ------------------------------------------------------------------ rss: a real process
def _state(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + STATE_PATH + "?limit=1", timeout=10.0) as resp:
        body: dict[str, Any] = json.loads(resp.read())
    return body


def rss_bytes(proc: subprocess.Popen[bytes]) -> int:
    """Resident set size of ``proc`` and its live descendants."""
    top = psutil.Process(proc.pid)
    total = 0
    for one in [top, *top.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += one.memory_info().rss
    return total


async def _drive(
    url: str,
    args: argparse.Namespace,
    proc: subprocess.Popen[bytes],
    first: int,
    count: int,
) -> tuple[int, int]:
    """Send requests ``first ..`` until ``count`` are answered or the time limit: (answered,
    errors). Stops at the first of the two."""
    bodies = bench.request_bodies(args.prompt_words, True)
    done = errors = 0
    numbers = iter(range(first, first + count))
    deadline = args.deadline_s
    async with contextlib.AsyncExitStack() as stack:
        send = await bench._lean_sender([url], bodies, stack)

        async def client() -> None:
            nonlocal done, errors
            for n in numbers:
                if time.monotonic() > deadline:
                    return
                if await send(n):
                    done += 1
                else:
                    errors += 1

        await asyncio.gather(*(client() for _ in range(args.concurrency)))
    return done, errors


def _rss(args: argparse.Namespace, urls: list[str], stack: contextlib.ExitStack) -> dict[str, Any]:
    url, proc = bench._start(stack, partial(bench.fairserve_argv, ups=urls, extra=[]))
    bench._uvloop()
    args.deadline_s = time.monotonic() + args.time_limit_s
    start_s = time.monotonic()
    cpu0 = bench.cpu_s([proc])
    points = [_point(0, 0, url, proc, start_s)]
    sent = 0
    while sent < args.requests and time.monotonic() < args.deadline_s:
        step = min(args.every, args.requests - sent)
        done, errors = asyncio.run(_drive(url, args, proc, sent + 1, step))
        sent += done + errors
        points.append(_point(sent, errors, url, proc, start_s))
        print(json.dumps(points[-1]), file=sys.stderr, flush=True)
        if done + errors < step:
            break
    cpu_s = bench.cpu_s([proc]) - cpu0
    half = [p for p in points if p["requests"] >= points[-1]["requests"] / 2]
    slope = None
    if len(half) >= 2 and half[-1]["requests"] > half[0]["requests"]:
        slope = (half[-1]["rss_bytes"] - half[0]["rss_bytes"]) / (
            half[-1]["requests"] - half[0]["requests"]
        )
    return {
        "requests": points[-1]["requests"],
        "requests_wanted": args.requests,
        "errors": sum(p["errors"] for p in points),
        "prompt_words": args.prompt_words,
        "kv_tokens_reported": args.kv_tokens,
        "rss_start_bytes": points[0]["rss_bytes"],
        "rss_end_bytes": points[-1]["rss_bytes"],
        "rss_max_bytes": max(p["rss_bytes"] for p in points),
        "rss_slope_bytes_per_request_second_half": slope,
        "router_cpu_s": cpu_s,
        "elapsed_s": time.monotonic() - start_s,
        "points": points,
    }


def _point(
    requests: int, errors: int, url: str, proc: subprocess.Popen[bytes], start_s: float
) -> dict[str, Any]:
    return {
        "requests": requests,
        "errors": errors,
        "elapsed_s": round(time.monotonic() - start_s, 1),
        "rss_bytes": rss_bytes(proc),
        "tree_tokens": tracked_tokens(_state(url)),
    }


# ------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with contextlib.ExitStack() as stack:
        urls = upstreams(stack, args.kv_tokens)
        if args.mode == "tree":
            bench._uvloop()
            report = asyncio.run(_tree(args, urls))
        else:
            report = _rss(args, urls, stack)
    report = {"mode": args.mode, "cpus": os.cpu_count(), **report}
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    tree = sub.add_parser("tree", help="Bytes per tracked prefix token (in process).")
    tree.add_argument("--prompts", type=int, default=20_000)
    tree.add_argument("--prompt-words", type=int, default=200)
    tree.add_argument("--warmup", type=int, default=200, help="Requests before measuring.")
    tree.add_argument("--frames", type=int, default=16, help="tracemalloc frames kept.")
    tree.add_argument(
        "--kv-tokens", type=int, default=1 << 30,
        help="KV capacity the upstreams report (large: nothing evicted).",
    )  # fmt: skip
    rss = sub.add_parser("rss", help="RSS of a real router process over many prompts.")
    rss.add_argument("--requests", type=int, default=1_000_000)
    rss.add_argument("--prompt-words", type=int, default=50)
    rss.add_argument("--every", type=int, default=50_000, help="Requests between samples.")
    rss.add_argument("--time-limit-s", type=float, default=480.0)
    rss.add_argument("--kv-tokens", type=int, default=RSS_KV_TOKENS,
                     help="KV capacity the upstreams report (0: none reported).")  # fmt: skip
    for one in (tree, rss):
        one.add_argument("--concurrency", type=int, default=32)
        one.add_argument("--json", action="store_true")
    return parser


def render(report: dict[str, Any]) -> str:
    mib = 1 << 20
    if report["mode"] == "tree":
        t = report["tracked_tokens"]
        per = report["tree_bytes_per_tracked_token"]
        kept = report["router_bytes_kept_per_tracked_token"]
        return "\n".join([
            f"{report['prompts']:,} distinct prompts ({_words(report['prompt_words'])}) "
            f"through an in-process router ({report['cpus']} CPUs)",
            f"tracked prefix tokens: global tree {t['global']:,}, fair-queue trees {t['local']:,}",
            f"all memory the router kept: {report['router_bytes_kept'] / mib:.1f} MiB = "
            + ("-" if kept is None else f"{kept:.1f} bytes per tracked token, ")
            + f"{report['router_bytes_kept_per_request']:.0f} bytes per request",
            f"of which allocated by the tree code: {report['tree_bytes'] / mib:.1f} MiB = "
            + ("-" if per is None else f"{per:.1f} bytes per tracked token"),
        ])  # fmt: skip
    slope = report["rss_slope_bytes_per_request_second_half"]
    lines = [
        f"{report['requests']:,} of {report['requests_wanted']:,} distinct prompts "
        f"({_words(report['prompt_words'])}) through a router process in "
        f"{report['elapsed_s']:.0f} s "
        f"({report['errors']} errors; upstreams report {report['kv_tokens_reported']:,} KV "
        f"tokens; {report['cpus']} CPUs)",
        f"{'requests':>10} {'s':>7} {'RSS MiB':>8} {'global tree tok':>16} {'queue trees tok':>16}",
    ]
    for p in report["points"]:
        tokens = p["tree_tokens"]
        lines.append(f"{p['requests']:>10,} {p['elapsed_s']:>7.1f} {p['rss_bytes'] / mib:>8.1f} "
                     f"{tokens['global']:>16,} {tokens['local']:>16,}")  # fmt: skip
    lines.append(
        "RSS slope over the second half: "
        + ("-" if slope is None else f"{slope:.2f} bytes per request")
    )
    return "\n".join(lines)


def _words(words: int) -> str:
    return f"about {words:,} words" if words > 0 else "one sentence each"


if __name__ == "__main__":
    sys.exit(main())
