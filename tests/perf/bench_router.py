"""Router overhead benchmark: requests/s and latency with instant upstreams (DESIGN §8).

Cases, against two upstreams that answer a small completion at once: ``direct``,
``fairserve``, ``fairserve-base`` (``--compare-cli``), ``fairserve-NAME`` (``--variant``,
``--other-cli``),
``sglang-router-POLICY`` (Rust, PyPI; ``--sglang-policy``) and ``smg-POLICY`` (its
successor, PyPI, the ``perf`` extra; ``--smg-policy``). All servers run throughout and the
cases are interleaved over ``--rounds`` rounds, under load and with one client (the latency
added without queueing), so that other load on the machine hits all alike; ratios are taken
within each round. ``--harness lean`` (raw asyncio HTTP/1.1 load generator and upstreams)
leaves more CPU to the routers than ``aiohttp``. Each router's CPU time per request (its
processes, all threads and children) is reported too: fairserve's router is one Python
thread, so its requests/s are capped at one core's worth, while the compiled routers
spread their work over threads. Prompts: ``--prompt-case sentence|shared|unique|all`` (one
sentence; about ``--prompt-words`` words, default 2,000, all alike (a shared document);
as long, no two sharing any text), several cases in the same rounds, with a cross-case
table at the end; or one case by ``--prompt-words N [--unique-prompts]``. ``--profile``
samples where each fairserve router spends its CPU (a CPU-time timer inside the router
process, see :class:`Sampler`) and prints it as microseconds per request by component
(:data:`COMPONENTS`) beside the totals, then by the innermost fairserve function (where
a component's time goes). Not a test: nothing asserts a speed. The issue-23
comparison::

    python tests/perf/bench_router.py --harness lean --rounds 3 --prompt-case all \
        --sglang-policy round_robin --sglang-policy cache_aware \
        --smg-policy cache_aware --smg-policy round_robin
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # runnable as a script: the shared test helpers
    sys.path.insert(0, str(ROOT))

from tests.worker.processes import free_port, wait_http_ok  # noqa: E402

ANSWER = {
    "id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "text": " ok ok ok ok", "logprobs": None, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12,
              "prompt_tokens_details": {"cached_tokens": 0}},
}  # fmt: skip
REQUEST: dict[str, Any] = {
    "model": "bench",
    "prompt": "Say something short about fairness.",
    "max_tokens": 4,
}
_FILLER = ("the", "shared", "service", "schedules", "every", "client", "fairly", "and",
           "reuses", "cached", "prefixes")  # fmt: skip
DEFAULT_KV_TOKENS = 100_000
"""KV capacity the bench upstreams report (the router bounds its trees by it)."""
INFO = {"model_path": "bench", "max_total_num_tokens": DEFAULT_KV_TOKENS, "is_generation": True}
MODELS = {"object": "list", "data": [{"id": "bench", "object": "model"}]}
Bodies = Callable[[int], bytes]
"""Request number -> the body of that request."""


UNIQUE_DOCUMENTS = 1024
"""Distinct documents ``--unique-prompts`` cycles through: more text than the tokenizer's
memo of chunks holds, so no chunk is found there."""


def request_bodies(prompt_words: int, unique: bool) -> Bodies:
    """The requests' bodies: the short prompt, or one of about ``prompt_words`` words (a
    document, then the question), as real prompts run to thousands of tokens. The router
    tokenizes every prompt; with ``unique`` no two prompts in a row share any text (each
    starts with its request number; long ones cycle through distinct documents), so
    nothing tokenized before can be reused: the worst case."""
    documents = [""]
    if prompt_words > 0:
        count = UNIQUE_DOCUMENTS if unique else 1
        rng = random.Random(0)
        documents = [document(prompt_words, rng if i else None) for i in range(count)]
    bodies = [
        json.dumps({**REQUEST, "prompt": "[0] " + text + REQUEST["prompt"]}).encode()
        for text in documents
    ]
    if not unique:
        return lambda n: bodies[0]
    parts = [body.split(b"[0]", 1) for body in bodies]

    def numbered(n: int) -> bytes:
        head, tail = parts[n % len(parts)]
        return b"%b[%d]%b" % (head, n, tail)

    return numbered


def document(words: int, rng: random.Random | None) -> str:
    """``words`` filler words and a full stop; with ``rng``, each word gets a random
    number appended, so documents differ everywhere, not only at their start."""
    chosen = [_FILLER[i % len(_FILLER)] for i in range(words)]
    if rng is not None:
        chosen = [word + str(rng.randrange(100)) for word in chosen]
    return " ".join(chosen) + ". "


def _routes(kv_tokens: int) -> dict[tuple[str, str], bytes]:
    """The upstream's answers; its server info reports ``kv_tokens`` of KV capacity (0:
    none reported, as a worker that does not say)."""
    answer, models = json.dumps(ANSWER).encode(), json.dumps(MODELS).encode()
    info = {**INFO, "max_total_num_tokens": kv_tokens} if kv_tokens else {
        k: v for k, v in INFO.items() if k != "max_total_num_tokens"}  # fmt: skip
    routes = {("POST", "/v1/completions"): answer, ("POST", "/v1/chat/completions"): answer,
              ("GET", "/health"): b"{}", ("GET", "/v1/models"): models}  # fmt: skip
    for path in ("/get_server_info", "/server_info", "/get_model_info", "/model_info"):
        routes[("GET", path)] = json.dumps(info).encode()
    return routes


# ------------------------------------------------------------------ upstreams (own process)
def serve_upstream(port: int, harness: str, kv_tokens: int = DEFAULT_KV_TOKENS) -> None:
    _uvloop()
    if harness == "lean":
        asyncio.run(_serve_lean(port, kv_tokens))
        return
    from aiohttp import web

    def fixed(body: bytes) -> Any:
        async def handle(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(body=body, content_type="application/json")

        return handle

    app = web.Application()
    routes = _routes(kv_tokens).items()
    app.add_routes([web.route(m, p, fixed(body)) for (m, p), body in routes])
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


class _LeanUpstream(asyncio.Protocol):
    """Answers each request on a keep-alive connection from a fixed table (404 else)."""

    def __init__(self, routes: dict[tuple[bytes, bytes], bytes]) -> None:
        self.routes, self.buf = routes, b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        if transport is None:  # never: asyncio connects before it delivers data
            return
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            lines = self.buf[:end].split(b"\r\n")
            method, path, _ = lines[0].split(b" ", 2)
            length = next((int(x[15:]) for x in lines if x[:15].lower() == b"content-length:"), 0)
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            body = self.routes.get((method, path.partition(b"?")[0]))
            status = b"200 OK" if body is not None else b"404 Not Found"
            body = b"{}" if body is None else body
            transport.write(
                b"HTTP/1.1 %b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                % (status, len(body), body)
            )


async def _serve_lean(port: int, kv_tokens: int) -> None:
    routes = {(m.encode(), p.encode()): body for (m, p), body in _routes(kv_tokens).items()}
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _LeanUpstream(routes), "127.0.0.1", port)
    await server.serve_forever()


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
    devnull = subprocess.DEVNULL
    proc = subprocess.Popen(argv, env=env, stdin=devnull, stdout=devnull, stderr=devnull)
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


def _start(
    stack: contextlib.ExitStack, argv: Any, cli: Path = CLI_DIR
) -> tuple[str, subprocess.Popen[bytes]]:
    """Run ``argv(port)`` on a free port until ``stack`` ends; its URL and process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = stack.enter_context(process(argv(port), url + "/health", cli))
    return url, proc


def cpu_s(procs: list[subprocess.Popen[bytes]]) -> float:
    """User + system CPU seconds used so far by ``procs``: all their threads, their live
    descendants, and the children they have already waited for."""
    total = 0.0
    for proc in procs:
        top = psutil.Process(proc.pid)
        for one in [top, *top.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = one.cpu_times()
                total += times.user + times.system + times.children_user + times.children_system
    return total


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


def fairserve_argv(
    port: int, ups: list[str], extra: list[str], profile: Path | None = None
) -> list[str]:
    """``fairserve router``; with ``profile``, under :class:`Sampler` (samples to that file)."""
    launcher = ["-m", "fairserve"] if profile is None else [__file__, SAMPLED, str(profile)]
    return [sys.executable, *launcher, "router", "--port", str(port), *extra,
            *(x for url in ups for x in ("--worker-url", url))]  # fmt: skip


# ------------------------------------------------------------------ CPU profile (--profile)
SAMPLED = "--sampled-router"
"""``bench_router.py --sampled-router FILE router ...``: the router under :class:`Sampler`."""
SAMPLE_INTERVAL_S = 0.001
"""CPU time between samples (the kernel's timer tick makes it ~4 ms at HZ=250)."""
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("client socket write", ("router/front.py:answer", "router/front.py:write")),
    ("upstream socket write", ("router/pool.py:send",)),
    ("request JSON decode", ("core/json_body.py:",)),  # decode_whole: neutral (its caller's)
    ("request validation", ("core/openai_api.py:", "core/prefix_key.py:", "router/identity.py:")),
    ("fair queue (DLPM)", ("router/fairqueue.py:", "sched/local/")),
    ("dispatcher, cache model, trees", ("sched/", "core/radix", "router/caches.py:")),
    ("accounting, ledger", ("router/accounting.py:", "core/ledger")),
    ("answer JSON, usage", ("router/relay.py:",)),
    ("answer head, framing (recv incl.)", ("router/pool.py:data_received", "router/pool.py:_",
                                           "router/framing.py:", "router/http11.py:parse_resp")),
    ("request head (recv incl.)", ("router/front.py:data_received", "router/front.py:_next",
                                   "router/front_head.py:", "router/http11.py:")),
    ("lifecycle, feeds, slots", ("router/lifecycle.py:", "router/feeds.py:", "router/slots.py:")),
    ("prepare_call, rest", ("router/handlers.py:",)),
    ("proxy, pool, front (glue)", ("router/proxy.py:", "router/pool.py:", "router/front.py:",
                                   "router/service.py:")),
)  # fmt: skip
"""(component, prefixes of ``module:function`` under ``fairserve/``): a sample counts for the
component of its innermost fairserve frame that matches one, helpers in :data:`NEUTRAL`
skipped (they count for their caller); the rest is the event loop's (``OTHER``). Socket
writes are the kernel's loopback work; a read is the first line of ``data_received``."""
NEUTRAL = ("sched/base.py:", "core/types.py:", "core/cost.py:", "core/json_body.py:decode_whole")
OTHER = "event loop, other"


def component(where: str) -> str | None:
    """The component of a frame at ``where`` (``module:function`` under ``fairserve/``);
    None: neutral or none (the caller decides)."""
    if where.startswith(NEUTRAL):
        return None
    return next((name for name, prefixes in COMPONENTS if where.startswith(prefixes)), None)


class Sampler:
    """A CPU-time sampling profiler for the router process: every ``SAMPLE_INTERVAL_S`` of
    its CPU time (``ITIMER_PROF``: user and system, so socket writes count) the stack is
    read and counted for its :func:`component`. ``SIGUSR1`` clears the counts and starts
    sampling, ``SIGUSR2`` stops and writes them to ``out`` (JSON): the bench brackets each
    measured load with them. Samples land at the next bytecode, so a read's system time
    counts for the first line of the ``data_received`` it feeds."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.counts: Counter[str] = Counter()
        self.functions: Counter[str] = Counter()
        """Samples by the innermost fairserve function (``module:function``): where the
        time of a component goes (written beside ``out``, :func:`functions_path`)."""
        self._of_code: dict[types.CodeType, str | None] = {}
        self._function_of: dict[types.CodeType, str | None] = {}

    def install(self) -> None:
        signal.signal(signal.SIGUSR1, self._start)
        signal.signal(signal.SIGUSR2, self._stop)

    def _start(self, *_: object) -> None:
        self.counts.clear()
        self.functions.clear()
        signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, SAMPLE_INTERVAL_S, SAMPLE_INTERVAL_S)

    def _stop(self, *_: object) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        partial_out = self.out.with_suffix(".part")
        partial_out.write_text(json.dumps(self.counts))
        functions_path(self.out).write_text(json.dumps(self.functions))
        partial_out.replace(self.out)  # whole or absent for the reader

    def _sample(self, _sig: int, frame: types.FrameType | None) -> None:
        found: str | None = None
        function: str | None = None
        while frame is not None and found is None:
            code = frame.f_code
            if function is None:
                function = self._function(code)
            found = self._component(code)
            frame = frame.f_back
        self.counts[found or OTHER] += 1
        self.functions[function or OTHER] += 1

    def _function(self, code: types.CodeType) -> str | None:
        """``module:function`` of a fairserve frame (None: not fairserve's)."""
        if code not in self._function_of:
            _, sep, module = code.co_filename.rpartition("fairserve/")
            self._function_of[code] = f"{module}:{code.co_name}" if sep else None
        return self._function_of[code]

    def _component(self, code: types.CodeType) -> str | None:
        if code not in self._of_code:
            _, sep, module = code.co_filename.rpartition("fairserve/")
            self._of_code[code] = component(f"{module}:{code.co_name}") if sep else None
        return self._of_code[code]


def sampled_router(out: Path, argv: list[str]) -> int:
    """Run ``fairserve ARGV`` under a :class:`Sampler` writing to ``out``."""
    Sampler(out).install()
    from fairserve.commands.app import main as fairserve_main

    sys.argv = ["fairserve", *argv]
    fairserve_main()  # exits


def functions_path(out: Path) -> Path:
    """Where a :class:`Sampler` writing ``out`` writes its per-function samples."""
    return out.with_suffix(".functions.json")


def read_functions(out: Path) -> Counter[str]:
    """The per-function samples of the last :func:`read_samples` (empty if none)."""
    path = functions_path(out)
    return Counter(json.loads(path.read_text())) if path.exists() else Counter()


def read_samples(proc: subprocess.Popen[bytes], out: Path, timeout_s: float = 10.0) -> Counter[str]:
    """Stop ``proc``'s sampler and read what it counted (empty if it never wrote)."""
    out.unlink(missing_ok=True)
    functions_path(out).unlink(missing_ok=True)
    proc.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + timeout_s
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return Counter(json.loads(out.read_text())) if out.exists() else Counter()


def sglang_argv(port: int, ups: list[str], policy: str, module: str) -> list[str]:
    """A compiled router: ``sglang_router.launch_router`` or its successor ``smg launch``
    (same flags, both PyPI)."""
    launcher = ["sglang_router.launch_router"] if module == "sglang-router" else ["smg", "launch"]
    return [
        sys.executable, "-m", *launcher, "--worker-urls", *ups,
        "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(free_port()), "--policy", policy, "--log-level", "warn",
    ]  # fmt: skip


# ------------------------------------------------------------------ load
Send = Any  # async (n) -> bool: request number n (spread over the URLs) answered 200


async def _aiohttp_sender(
    urls: list[str], bodies: Bodies, stack: contextlib.AsyncExitStack
) -> Send:
    import aiohttp

    headers = {"Content-Type": "application/json"}
    session = await stack.enter_async_context(
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    )
    targets = [url + "/v1/completions" for url in urls]

    async def send(n: int) -> bool:
        async with session.post(targets[n % len(targets)], data=bodies(n), headers=headers) as resp:
            await resp.read()
            return resp.status == 200

    return send


async def _lean_sender(urls: list[str], bodies: Bodies, stack: contextlib.AsyncExitStack) -> Send:
    from fairserve.router.framing import UpstreamError
    from fairserve.router.pool import Pool

    pools = [Pool(url, 5.0, 60.0) for url in urls]
    for pool in pools:
        stack.callback(pool.close)
    heads = [pool.head("/v1/completions") for pool in pools]

    async def send(n: int) -> bool:
        i = n % len(pools)
        try:
            resp = await pools[i].post(heads[i], b"", bodies(n))
            await resp.read()
        except UpstreamError:
            return False
        return resp.status == 200

    return send


PromptCase = tuple[str, int, bool]
"""(name, words, unique): what ``request_bodies`` sends."""


async def load(
    urls: list[str], args: argparse.Namespace, clients: int, case: PromptCase
) -> dict[str, Any]:
    """``clients`` closed-loop clients for ``args.duration`` (``args.single_duration`` for
    one client) after ``args.warmup``, sending ``case``'s prompts: requests/s and latency
    percentiles."""
    duration_s = args.duration if clients > 1 else args.single_duration
    latencies: list[float] = []
    errors = sent = 0
    async with contextlib.AsyncExitStack() as stack:
        make = _lean_sender if args.harness == "lean" else _aiohttp_sender
        send = await make(urls, request_bodies(case[1], case[2]), stack)
        measure_from = time.perf_counter() + args.warmup
        stop_at = measure_from + duration_s

        async def client() -> None:
            nonlocal errors, sent
            while (t0 := time.perf_counter()) < stop_at:
                sent += 1  # also the request's number: every request has its own
                ok = await send(sent)
                if t0 >= measure_from:
                    if ok:
                        latencies.append(time.perf_counter() - t0)
                    else:
                        errors += 1

        await asyncio.gather(*(client() for _ in range(clients)))
    latencies.sort()
    n = len(latencies)
    return {
        "requests_per_s": n / duration_s,
        "p50_ms": latencies[n // 2] * 1e3 if n else None,
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1e3 if n else None,
        "requests": n,
        "sent": sent,
        "errors": errors,
    }


def measure(
    urls: list[str],
    args: argparse.Namespace,
    procs: list[subprocess.Popen[bytes]],
    case: PromptCase,
    profile: Path | None = None,
) -> dict[str, Any]:
    """One case in one round: under load, then (``--single-duration`` > 0) one client.

    ``procs``: the router's processes, whose CPU per request (warm-up included, divided by
    every request sent) is reported: what the router costs, apart from how many cores it
    can use. ``profile``: the router runs under a :class:`Sampler` writing there; its
    samples of the loaded phase are reported (``samples``: component -> count)."""
    _uvloop()
    if profile is not None:
        procs[0].send_signal(signal.SIGUSR1)
    cpu0 = cpu_s(procs)
    out = {"load": asyncio.run(load(urls, args, args.concurrency, case))}
    if procs:
        sent = out["load"]["sent"]
        out["load"]["cpu_us_per_request"] = (cpu_s(procs) - cpu0) / sent * 1e6 if sent else None
    if profile is not None:
        out["load"]["samples"] = dict(read_samples(procs[0], profile))
        out["load"]["function_samples"] = dict(read_functions(profile))
    if args.single_duration > 0:
        out["single"] = asyncio.run(load(urls, args, 1, case))
    return out


# ------------------------------------------------------------------ main
PROMPT_CASES = ("sentence", "shared", "unique")
"""``--prompt-case`` names: one short sentence; a long document every request shares; long
prompts no two of which share any text (the issue-23 table's rows)."""
LONG_PROMPT_WORDS = 2000


def prompt_cases(args: argparse.Namespace) -> list[tuple[str, int, bool]]:
    """(name, words, unique) per prompt case to run: ``--prompt-case`` (``all``: the three),
    else the one ``--prompt-words``/``--unique-prompts`` describe."""
    chosen = args.prompt_case or []
    if "all" in chosen:
        chosen = list(PROMPT_CASES)
    if not chosen:
        name = (
            "sentence" if args.prompt_words <= 0 else "unique" if args.unique_prompts else "shared"
        )
        return [(name, args.prompt_words, args.unique_prompts)]
    words = args.prompt_words if args.prompt_words > 0 else LONG_PROMPT_WORDS
    cases = {"sentence": (0, False), "shared": (words, False), "unique": (words, True)}
    return [(name, *cases[name]) for name in dict.fromkeys(chosen)]


def compiled_routers(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(launcher, policy) per compiled router case: ``sglang-router`` and ``smg``."""
    if args.skip_sglang:
        return []
    sglang = [("sglang-router", p) for p in args.sglang_policy or ["round_robin"]]
    return sglang + [("smg", p) for p in args.smg_policy or []]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [SAMPLED]:
        return sampled_router(Path(argv[1]), argv[2:])
    args = _parser().parse_args(argv)
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        reports = saved if isinstance(saved, list) else [saved]
        print("\n\n".join(render(report) for report in reports))
        print("\n" + render_table(reports))
        return 0
    if args.serve_upstream:
        serve_upstream(args.serve_upstream, args.harness, args.upstream_kv_tokens)
        return 0
    me = [sys.executable, str(Path(__file__).resolve()), "--harness", args.harness]
    ports = [free_port(), free_port()]
    upstreams = [f"http://127.0.0.1:{p}" for p in ports]
    targets: dict[str, list[str]] = {"direct": upstreams}
    procs: dict[str, list[subprocess.Popen[bytes]]] = {"direct": []}
    cases = prompt_cases(args)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in cases}
    profiles: dict[str, Path] = {}
    with contextlib.ExitStack() as stack:
        samples_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for port, url in zip(ports, upstreams, strict=True):
            stack.enter_context(process([*me, "--serve-upstream", str(port)], url + "/health"))
        main_args = ["--dispatch", args.dispatch, "--router-queue", args.router_queue]
        routers = [("fairserve", CLI_DIR, main_args)]
        if args.compare_cli is not None:
            routers.append(("fairserve-base", args.compare_cli.resolve(), main_args))
        for other in args.other_cli:
            name, _, tree = other.partition("=")
            routers.append((f"fairserve-{name}", Path(tree).resolve(), main_args))
        for variant in args.variant:
            name, _, extra = variant.partition("=")
            routers.append((f"fairserve-{name}", CLI_DIR, extra.split()))
        for name, cli, extra in routers:
            if args.profile:
                profiles[name] = samples_dir / f"{name}.json"
            profile = profiles.get(name)
            argv_of = partial(fairserve_argv, ups=upstreams, extra=extra, profile=profile)
            url, proc = _start(stack, argv_of, cli)
            targets[name], procs[name] = [url], [proc]
        for launcher, policy in compiled_routers(args):
            name = f"{launcher}-{policy}"
            argv_of = partial(sglang_argv, ups=upstreams, policy=policy, module=launcher)
            url, proc = _start(stack, argv_of)
            targets[name], procs[name] = [url], [proc]
            wait_sglang_workers(targets[name][0], 2)
        names = list(targets)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for case in cases:
                measured = {
                    name: measure(targets[name], args, procs[name], case, profiles.get(name))
                    for name in order
                }
                rounds[case[0]].append(measured)
    reports = [
        summarise(rounds[name], args, (name, words, unique)) for name, words, unique in cases
    ]
    if args.json:
        print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
    else:
        print("\n\n".join(render(report) for report in reports))
        print("\n" + render_table(reports))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--concurrency", type=int, default=32, help="Clients of the load phase.")
    add("--duration", type=float, default=3.0, help="Measured s per case and round.")
    add("--rounds", type=int, default=3, help="Interleaved rounds.")
    add("--single-duration", type=float, default=1.0,
        help="Measured s per case and round with one client (added latency without "
        "queueing); 0: skip.")  # fmt: skip
    add("--warmup", type=float, default=0.5)
    add("--prompt-words", type=int, default=0,
        help="Prompt length in words (0: one short sentence); each word is about one "
        "token, and the router tokenizes every prompt for its prefix tree.")  # fmt: skip
    add("--unique-prompts", action="store_true",
        help="No two prompts share a prefix (each starts with its request number).")  # fmt: skip
    add("--prompt-case", action="append", choices=(*PROMPT_CASES, "all"),
        help="Prompt case, repeatable, run in the same rounds (replaces --unique-prompts): "
        "sentence (one sentence), shared (--prompt-words, default 2000, all alike), unique "
        "(as long, no two alike); all: the three, and the cross-case table.")  # fmt: skip
    add("--harness", choices=("aiohttp", "lean"), default="aiohttp",
        help="Load generator and upstreams (see the module docstring).")  # fmt: skip
    add("--dispatch", default="doubleq", help="fairserve router --dispatch.")
    add("--router-queue", choices=("auto", "on", "off"), default="auto",
        help="fairserve router --router-queue (the bench upstreams have no fairserve "
        "extension, so auto means on; off shows the router without its fair queue).")  # fmt: skip
    add("--compare-cli", type=Path, metavar="DIR",
        help="Also run fairserve from another source tree (e.g. the previous commit's "
        "cli/) as case fairserve-base, in the same run.")  # fmt: skip
    add("--other-cli", action="append", default=[], metavar="NAME=DIR",
        help="Also run fairserve from this source tree as case fairserve-NAME (repeatable; "
        "e.g. a tree with an experimental change), in the same run.")  # fmt: skip
    add("--variant", action="append", default=[], metavar="NAME=ARGS",
        help="Another fairserve case with these router arguments, e.g. plain='--dispatch "
        "round-robin --router-queue off' (repeatable).")  # fmt: skip
    add("--sglang-policy", action="append", metavar="POLICY",
        help="sglang-router --policy, repeatable (default round_robin; its own default is "
        "cache_aware).")  # fmt: skip
    add("--smg-policy", action="append", metavar="POLICY",
        help="Also run smg (sglang-router's successor, PyPI, the perf extra) with this "
        "--policy, repeatable (default: not run).")  # fmt: skip
    add("--skip-sglang", action="store_true", help="Run neither sglang-router nor smg.")
    add("--profile", action="store_true",
        help="Sample where each fairserve router spends its CPU under load and print it as "
        "us per request by component and by its hottest functions (a CPU-time timer in the "
        "router process).")  # fmt: skip
    add("--json", action="store_true")
    add("--render", type=Path, metavar="JSON",
        help="Print the tables of a saved --json report and exit.")  # fmt: skip
    add("--serve-upstream", type=int, help=argparse.SUPPRESS)
    add("--upstream-kv-tokens", type=int, default=DEFAULT_KV_TOKENS, help=argparse.SUPPRESS)
    return parser


def summarise(
    rounds: list[dict[str, Any]], args: argparse.Namespace, case: PromptCase
) -> dict[str, Any]:
    """Medians per router over the rounds of one prompt case; ratios within each round,
    then their median."""
    cases: dict[str, Any] = {}
    for name in rounds[0]:
        loaded = [r[name]["load"] for r in rounds]
        rps = [x["requests_per_s"] for x in loaded]
        single = [r[name]["single"] for r in rounds if "single" in r[name]]
        cases[name] = {
            "requests_per_s": statistics.median(rps),
            "requests_per_s_range": [min(rps), max(rps)],
            "p50_ms": _median(x["p50_ms"] for x in loaded),
            "p99_ms": _median(x["p99_ms"] for x in loaded),
            "errors": sum(x["errors"] for x in loaded + single),
            "cpu_us_per_request": _median(x.get("cpu_us_per_request") for x in loaded),
            "single_p50_ms": _median(x["p50_ms"] for x in single),
            "single_p99_ms": _median(x["p99_ms"] for x in single),
        }
        if any("samples" in x for x in loaded):
            samples = [x.get("samples", {}) for x in loaded]
            cases[name]["profile_us"] = profile_us(samples, cases[name]["cpu_us_per_request"])
            cases[name]["profile_samples"] = sum(sum(x.values()) for x in samples)
            functions = [x.get("function_samples", {}) for x in loaded]
            cases[name]["profile_functions_us"] = dict(
                list(profile_us(functions, cases[name]["cpu_us_per_request"]).items())[
                    :PROFILE_FUNCTIONS
                ]
            )
    per_round: dict[str, list[float]] = {}
    for r in rounds:
        for key, value in _ratios(r).items():
            per_round.setdefault(key, []).append(value)
    ratios = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
              for k, v in per_round.items()}  # fmt: skip
    keys = (
        "harness",
        "concurrency",
        "router_queue",
        "duration",
        "single_duration",
        "rounds",
    )
    name, words, unique = case
    return {**{k: getattr(args, k) for k in keys}, "prompt_case": name, "prompt_words": words,
            "unique_prompts": unique, "cpus": os.cpu_count(), "cases": cases,
            "ratios": ratios, "per_round": rounds}  # fmt: skip


PROFILE_FUNCTIONS = 25
"""Functions listed per profiled router (``--profile``), the most sampled first."""


def profile_us(samples: list[dict[str, int]], cpu_us: float | None) -> dict[str, float]:
    """Component -> CPU us per request: the rounds' samples summed, as shares of ``cpu_us``
    (the median CPU per request), largest first."""
    total: Counter[str] = Counter()
    for counts in samples:
        total.update(counts)
    count = sum(total.values())
    if not count or cpu_us is None:
        return {}
    return {name: n / count * cpu_us for name, n in total.most_common()}


def _median(values: Any) -> float | None:
    return statistics.median(present) if (present := [v for v in values if v is not None]) else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ratios(r: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    routers = [name for name in r if name != "direct"]
    for name in routers:
        for kind, label in (("load", ""), ("single", " (1 client)")):
            case, direct = r[name].get(kind), r["direct"].get(kind)
            if case is None or direct is None or case["p50_ms"] is None:
                continue
            if kind == "load" and direct["requests_per_s"]:
                out[f"{name}/direct rps"] = case["requests_per_s"] / direct["requests_per_s"]
            out[f"{name} added p50 ms{label}"] = case["p50_ms"] - direct["p50_ms"]
            out[f"{name} added p99 ms{label}"] = case["p99_ms"] - direct["p99_ms"]
    mine = r["fairserve"]["load"]
    for base in routers:
        if base != "fairserve" and r[base]["load"]["requests_per_s"]:
            rps = r[base]["load"]["requests_per_s"]
            out[f"fairserve/{base} rps"] = mine["requests_per_s"] / rps
        cpu = r[base]["load"].get("cpu_us_per_request")
        if base != "fairserve" and cpu and mine.get("cpu_us_per_request") is not None:
            out[f"fairserve/{base} cpu"] = mine["cpu_us_per_request"] / cpu
    return out


def _prompt_label(words: int, unique: bool) -> str:
    label = f"about {words} words" if words > 0 else "one sentence"
    return label + (", no two alike" if unique else ", all alike")


def render(report: dict[str, Any]) -> str:
    lines = [
        f"harness {report['harness']}, {report['concurrency']} clients (and 1), "
        f"{report['rounds']} rounds x {report['duration']} s (1 client: "
        f"{report['single_duration']} s) per case, {report['cpus']} CPUs, fairserve "
        f"--router-queue {report['router_queue']}, prompt: "
        + _prompt_label(report["prompt_words"], report["unique_prompts"]),
        f"{'case':26} {'req/s':>8} {'(min-max)':>13} {'p50 ms':>7} {'p99 ms':>7}"
        f" {'1 client p50':>12} {'p99':>6} {'errors':>6} {'CPU us/req':>10}",
    ]
    for name, c in report["cases"].items():
        low, high = c["requests_per_s_range"]
        lines.append(f"{name:26} {c['requests_per_s']:8.0f} {low:6.0f}-{high:<6.0f} "
                     f"{c['p50_ms']:7.2f} {c['p99_ms']:7.2f} {c['single_p50_ms'] or 0:12.2f} "
                     f"{c['single_p99_ms'] or 0:6.2f} {c['errors']:6d} "
                     f"{_fmt(c['cpu_us_per_request']):>10}")  # fmt: skip
    lines.extend(render_profile(report))
    lines.append(f"{'ratio (per round)':50} {'median':>8} {'min':>8} {'max':>8}")
    for name, v in report["ratios"].items():
        lines.append(f"{name:50} {v['median']:8.3f} {v['min']:8.3f} {v['max']:8.3f}")
    return "\n".join(lines)


def render_profile(report: dict[str, Any]) -> list[str]:
    """Lines of the CPU-profile table (``--profile``): us per request by component, one
    column per profiled router; none without profiles."""
    profiled = {n: c["profile_us"] for n, c in report["cases"].items() if c.get("profile_us")}
    if not profiled:
        return []
    names = [name for name, _ in COMPONENTS] + [OTHER]
    counts = ", ".join(f"{n} {report['cases'][n]['profile_samples']:,}" for n in profiled)
    head = f"CPU us/request by component ({counts} samples)"
    lines = [head, f"{'':40}" + "".join(f" {n:>16}" for n in profiled)]
    for name in names:
        cells = "".join(f" {p.get(name, 0.0):16.1f}" for p in profiled.values())
        lines.append(f"{name:40}{cells}")
    totals = "".join(f" {sum(p.values()):16.1f}" for p in profiled.values())
    lines.append(f"{'total':40}{totals}")
    for name in profiled:
        functions = report["cases"][name].get("profile_functions_us") or {}
        if functions:
            lines.append(f"CPU us/request by innermost fairserve function ({name}, top)")
            lines.extend(f"  {us:6.1f}  {where}" for where, us in functions.items())
    return lines


_CASE_LABELS = {"sentence": "one sentence", "shared": "{} words, shared",
                "unique": "{} words, no two alike"}  # fmt: skip


def render_table(reports: list[dict[str, Any]]) -> str:
    """The cross-case table (issue 23's shape): one row per prompt case, per router its
    requests/s (CPU µs per request), the ratios fairserve / smg cache_aware (requests/s)
    and fairserve / the cheapest compiled router (CPU), then the p50 latency each adds with
    one client (its p50 minus direct's, per round, median)."""
    routers = [name for name in reports[0]["cases"] if name != "direct"]
    compiled = [name for name in routers if not name.startswith("fairserve")]
    head = ["prompt", *routers, "fairserve/smg-cache_aware req/s", "fairserve/best compiled CPU"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    added = ["| prompt | " + " | ".join(f"{n} added p50 ms (1 client)" for n in routers) + " |",
             "|" + "---|" * (len(routers) + 1)]  # fmt: skip
    for report in reports:
        label = _CASE_LABELS[report["prompt_case"]].format(f"{report['prompt_words']:,}")
        cells = [label]
        for name in routers:
            c = report["cases"][name]
            cpu = c["cpu_us_per_request"]
            cells.append(f"{c['requests_per_s']:,.0f} ({'-' if cpu is None else f'{cpu:.0f}'})")
        ratios = report["ratios"]
        smg = ratios.get("fairserve/smg-cache_aware rps")
        cells.append("-" if smg is None else f"{smg['median']:.2f}")
        cpus = [ratios[f"fairserve/{n} cpu"]["median"] for n in compiled
                if f"fairserve/{n} cpu" in ratios]  # fmt: skip
        # the cheapest compiled router has the largest fairserve/it ratio
        cells.append(f"{max(cpus):.2f}" if cpus else "-")
        lines.append("| " + " | ".join(cells) + " |")
        ms = [ratios.get(f"{n} added p50 ms (1 client)") for n in routers]
        shown = ("-" if m is None else f"{m['median']:.3f}" for m in ms)
        added.append(f"| {label} | " + " | ".join(shown) + " |")
    first = reports[0]
    title = (f"{first['rounds']} rounds, {first['concurrency']} clients, harness "
             f"{first['harness']}, {first['cpus']} CPUs: req/s (CPU us/req), medians")  # fmt: skip
    return "\n".join([title, *lines, "", *added])


if __name__ == "__main__":
    sys.exit(main())
