"""The load generator: a workload's programs over real HTTP, open and closed loop.

Programs start at their ``start_s`` (open-loop arrivals, whatever the server's speed); the
calls inside a program form a DAG and a call is due ``delay_s`` after its last parent's
answer is back (closed loop, like the simulator's cluster). Each call goes out with its
client's identity (``X-Fairserve-Client``) and application (``X-Fairserve-App``), streamed,
so time to first token is measured where the client sees it.

A call's ``arrival_s`` is when it was *due*, not when a connection became free, so a
saturated generator (``max_in_flight``) shows up in latency instead of hiding it. The
in-flight limit is per client: one shared cap would let the heaviest client fill it and
set every client's share by itself, distorting the fairness being measured.

``duration_s`` is when arrivals stop: only calls due before it are issued (the others are
counted ``unsent``, and calls waiting for an unsent one are ``skipped``); calls still in
flight then get up to ``timeout_s`` more (the drain), and the rest are ``unfinished``.
Neither skipped nor unfinished calls are errors: nothing failed, the run ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from fairserve.api import paths
from fairserve.bench.client import SKIPPED, UNFINISHED, Attempt, send
from fairserve.bench.prompts import Answer, Api, ancestors, request_body, segments
from fairserve.core.defaults import DEFAULT_MAX_IN_FLIGHT as DEFAULT_MAX_IN_FLIGHT
from fairserve.core.errors import ConfigError
from fairserve.workloads.model import Call, ClientInfo, Program, Workload

CLIENT_HEADER = "X-Fairserve-Client"
APP_HEADER = "X-Fairserve-App"
DEFAULT_TIMEOUT_S = 30.0
PROGRESS_INTERVAL_S = 0.25
SKIP_UNSENT = "a call it depends on was not sent (arrivals had stopped)"
SKIP_FAILED = "a call it depends on failed"


class Unreachable(ConnectionError):
    """Nothing answers at the URL (exit code 3 through ``commands.errors``)."""


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """How to drive the workload (the CLI's options)."""

    api: Api = "completions"
    duration_s: float | None = None
    """Stop issuing after this many seconds (default: the workload's duration)."""
    seed: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Per-request silence limit, and how long in-flight calls may run past the duration."""
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    """Most calls one client has open at once (its later calls wait for a slot)."""
    token: str | None = None
    """Sent as ``Authorization: Bearer`` with every call."""
    api_keys: Mapping[str, str] = field(default_factory=dict)
    """Per-client API keys (client name → key); they win over ``token``."""
    model: str | None = None


@dataclass(frozen=True, slots=True)
class ProgressInfo:
    elapsed_s: float
    duration_s: float
    sent: int
    finished: int
    failed: int
    in_flight: int


@dataclass
class BenchResult:
    """Everything one run measured, for the report and the plot."""

    url: str
    api: Api
    workload: str
    seed: int
    duration_s: float
    elapsed_s: float
    clients: tuple[ClientInfo, ...]
    attempts: list[Attempt]
    unsent: dict[str, int]
    programs: dict[str, Program]
    timeout_s: float = DEFAULT_TIMEOUT_S
    """The drain: how long calls in flight at ``duration_s`` could still run."""
    server_weights: dict[str, float] | None = None
    """The router's client weights (``GET /fairserve/v1/weights``), None when the server
    does not publish them; the report's weighted Jain's index uses them first."""
    auth_mode: str | None = None
    """How the router identifies clients (``/fairserve/v1/state``'s ``auth_mode``), None
    when the server is not a fairserve router."""
    interrupted_s: float | None = None
    """When the run was stopped early (Ctrl-C), seconds after its start; None if it ran
    its course. Calls then in flight count as unfinished."""
    merged: tuple[tuple[str, ...], ...] = ()
    """Groups of workload clients sent with one API key to a router that identifies
    clients by key: each group is one client there, whatever names the bench sends."""


ProgressFn = Callable[[ProgressInfo], None]


def normalize_url(url: str) -> str:
    """``http(s)://host:port`` without a trailing ``/`` or ``/v1`` (paths are added here)."""
    text = url.strip().rstrip("/")
    if not text.startswith(("http://", "https://")):
        raise ConfigError(f"--url: expected an http:// or https:// URL, got {url!r}")
    return text.removesuffix("/v1")


async def run_workload(
    url: str,
    workload: Workload,
    options: BenchOptions,
    progress: ProgressFn | None = None,
    stop: asyncio.Event | None = None,
) -> BenchResult:
    """Run ``workload`` against ``url``; raises :class:`Unreachable` if nothing answers.

    ``stop`` (set on Ctrl-C) ends the run at once: no more arrivals, no drain, the calls
    in flight cancelled and counted as unfinished, and the result is what was measured."""
    _check(options)
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=options.timeout_s, sock_read=options.timeout_s
    )
    # The per-client semaphores bound the calls; the pool must not add a shared cap.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        base = normalize_url(url)
        await probe(session, base, options.timeout_s)
        result = await _Run(session, base, workload, options, progress).run(stop)
        result.server_weights = await server_weights(session, base, options)
        result.auth_mode = await server_auth_mode(session, base, options)
        names = [c.name for c in result.clients]
        result.merged = merged_clients(result.auth_mode, names, options)
        return result


def _check(options: BenchOptions) -> None:
    if not options.timeout_s > 0:
        raise ConfigError(f"--timeout: expected a positive number, got {options.timeout_s}")
    if options.max_in_flight < 1:
        raise ConfigError(f"--max-in-flight: expected at least 1, got {options.max_in_flight}")
    if options.duration_s is not None and not options.duration_s > 0:
        raise ConfigError(f"--duration: expected a positive number, got {options.duration_s}")


async def probe(session: aiohttp.ClientSession, url: str, timeout_s: float) -> None:
    """Any HTTP answer from ``GET /v1/models`` proves the server is there."""
    try:
        limit = aiohttp.ClientTimeout(total=min(timeout_s, 10.0))
        async with session.get(url + "/v1/models", timeout=limit) as resp:
            await resp.read()
    except (aiohttp.ClientConnectionError, OSError, TimeoutError) as exc:
        detail = str(exc) or type(exc).__name__
        raise Unreachable(f"cannot reach {url}: {detail} (is the router running?)") from None


async def server_weights(
    session: aiohttp.ClientSession, url: str, options: BenchOptions
) -> dict[str, float] | None:
    """The router's weights, so the bench weighs service as ``top`` does; None if the
    server is not a fairserve router (or does not answer in time)."""
    headers = {"Authorization": f"Bearer {options.token}"} if options.token else {}
    try:
        limit = aiohttp.ClientTimeout(total=min(options.timeout_s, 5.0))
        async with session.get(url + paths.ROUTER_WEIGHTS, headers=headers, timeout=limit) as resp:
            if resp.status != 200:
                return None
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return None
    weights = body.get("weights") if isinstance(body, dict) else None
    if not isinstance(weights, dict):
        return None
    return {
        str(name): float(w)
        for name, w in weights.items()
        if isinstance(w, int | float) and not isinstance(w, bool) and w > 0
    }


async def server_auth_mode(
    session: aiohttp.ClientSession, url: str, options: BenchOptions
) -> str | None:
    """The router's identity mode (``open``, ``api-key``, ``api-key+trusted-header``); None
    if the server is not a fairserve router (or does not answer in time)."""
    try:
        limit = aiohttp.ClientTimeout(total=min(options.timeout_s, 5.0))
        async with session.get(url + paths.ROUTER_STATE + "?limit=1", timeout=limit) as resp:
            if resp.status != 200:
                return None
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return None
    router = body.get("router") if isinstance(body, dict) else None
    mode = router.get("auth_mode") if isinstance(router, dict) else None
    return mode if isinstance(mode, str) else None


def merged_clients(
    auth_mode: str | None, names: list[str], options: BenchOptions
) -> tuple[tuple[str, ...], ...]:
    """The workload clients that share one API key, per key, when the router identifies
    clients by key (``api-key`` modes): there the key wins over ``X-Fairserve-Client``, so
    the router charges such a group to one client and the bench's split of it is its own.
    Clients sent without a key keep their header name (``api-key+trusted-header``)."""
    if auth_mode is None or not auth_mode.startswith("api-key"):
        return ()
    by_key: dict[str, list[str]] = {}
    for name in names:
        key = options.api_keys.get(name, options.token)
        if key:
            by_key.setdefault(key, []).append(name)
    return tuple(tuple(group) for group in by_key.values() if len(group) > 1)


class _Run:
    """One run's state: the clock, the calls, the in-flight limit."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        workload: Workload,
        options: BenchOptions,
        progress: ProgressFn | None,
    ) -> None:
        self.session, self.url, self.options = session, url, options
        self.workload = workload
        self.seed = options.seed if options.seed is not None else workload.seed
        self.duration_s = options.duration_s or workload.duration_s
        self.progress = progress
        self.attempts: list[Attempt] = []
        self.unsent: dict[str, int] = {}
        self.programs: dict[str, Program] = {}
        self.slots: dict[str, asyncio.Semaphore] = {}
        self.unsent_calls: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.issued: set[str] = set()
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()

    def clock(self) -> float:
        return self.loop.time() - self.t0

    async def run(self, stop: asyncio.Event | None = None) -> BenchResult:
        ticker = asyncio.create_task(self._tick()) if self.progress else None
        interrupted_s = None
        try:
            if stop is None:
                await self._feed()
                await self._drain(self.options.timeout_s)
            elif await self._until_stopped(stop):
                interrupted_s = self.clock()
                await self._drain(0.0)
        finally:
            if ticker is not None:
                ticker.cancel()
                await asyncio.gather(ticker, return_exceptions=True)
        self._report_progress()
        return BenchResult(
            url=self.url,
            api=self.options.api,
            workload=self.workload.name,
            seed=self.seed,
            duration_s=self.duration_s,
            elapsed_s=self.clock(),
            clients=self.workload.clients,
            attempts=self.attempts,
            unsent=self.unsent,
            programs=self.programs,
            timeout_s=self.options.timeout_s,
            interrupted_s=interrupted_s,
        )

    async def _until_stopped(self, stop: asyncio.Event) -> bool:
        """Feed and drain unless ``stop`` is set first; True if it was."""
        work = asyncio.create_task(self._feed_and_drain())
        stopped = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        await asyncio.gather(stopped, return_exceptions=True)
        if work in done:
            await work  # its exception, if any, is the run's
            return False
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return True

    async def _feed_and_drain(self) -> None:
        await self._feed()
        await self._drain(self.options.timeout_s)

    async def _feed(self) -> None:
        """Start each program at its time; return once the duration is over."""
        for program in self.workload.programs(self.seed, self.duration_s):
            await self._sleep_until(program.start_s)
            self.programs[program.app] = program
            task = asyncio.create_task(self._program(program))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        await self._sleep_until(self.duration_s)

    async def _drain(self, timeout_s: float) -> None:
        """Give in-flight calls ``timeout_s``; cancel the rest (they record themselves)."""
        pending = set(self.tasks)
        if pending and timeout_s > 0:
            _, pending = await asyncio.wait(pending, timeout=timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _sleep_until(self, t_s: float) -> None:
        delay = t_s - self.clock()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _program(self, program: Program) -> None:
        done = {call.id: asyncio.Event() for call in program.calls}
        answers: dict[str, Answer | None] = {}
        lineage = ancestors(program)
        await asyncio.gather(
            *(self._call(program, c, done, answers, lineage[c.id]) for c in program.calls)
        )

    async def _call(
        self,
        program: Program,
        call: Call,
        done: dict[str, asyncio.Event],
        answers: dict[str, Answer | None],
        lineage: tuple[str, ...],
    ) -> None:
        """Wait for the parents, then send; always mark the call done for its children."""
        try:
            for parent in call.after:
                await done[parent].wait()
            due_s = (program.start_s if not call.after else self.clock()) + call.delay_s
            if any(answers.get(parent) is None for parent in call.after):
                self._skip(program, call, due_s)
                return
            await self._sleep_until(due_s)
            answers[call.id] = await self._send(program, call, due_s, answers, lineage)
        except asyncio.CancelledError:
            if call.id not in self.issued:
                self._count_unsent(program.client, call.id)
            raise
        finally:
            answers.setdefault(call.id, None)
            done[call.id].set()

    async def _send(
        self,
        program: Program,
        call: Call,
        due_s: float,
        answers: Mapping[str, Answer | None],
        lineage: tuple[str, ...],
    ) -> Answer | None:
        if due_s >= self.duration_s:
            self._count_unsent(program.client, call.id)
            return None
        calls = {c.id: c for c in program.calls}
        quoted = [(calls[a].output_key, ans) for a in lineage if (ans := answers.get(a))]
        body = request_body(self.options.api, segments(call, quoted), call.output_tokens)
        if self.options.model is not None:
            body["model"] = self.options.model
        attempt = Attempt(program.client, program.app, call.id, due_s, call.input_tokens)
        slots = self.slots.setdefault(program.client, asyncio.Semaphore(self.options.max_in_flight))
        async with slots:
            self.attempts.append(attempt)
            self.issued.add(call.id)
            try:
                return await send(
                    self.session, self.url, self.options.api, body,
                    self._headers(program), attempt, self.clock,
                )  # fmt: skip
            except asyncio.CancelledError:
                attempt.status = UNFINISHED
                raise

    def _headers(self, program: Program) -> dict[str, str]:
        headers = {CLIENT_HEADER: program.client, APP_HEADER: program.app}
        key = self.options.api_keys.get(program.client, self.options.token)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _skip(self, program: Program, call: Call, due_s: float) -> None:
        attempt = Attempt(program.client, program.app, call.id, due_s, call.input_tokens)
        attempt.status = SKIPPED
        if any(parent in self.unsent_calls for parent in call.after):
            attempt.message = SKIP_UNSENT
        else:
            attempt.message = SKIP_FAILED
        self.attempts.append(attempt)

    def _count_unsent(self, client: str, call_id: str) -> None:
        self.unsent[client] = self.unsent.get(client, 0) + 1
        self.unsent_calls.add(call_id)

    async def _tick(self) -> None:
        while True:
            self._report_progress()
            await asyncio.sleep(PROGRESS_INTERVAL_S)

    def _report_progress(self) -> None:
        if self.progress is None:
            return
        sent = finished = failed = 0
        for attempt in self.attempts:
            sent += attempt.sent_s is not None
            finished += attempt.ok
            failed += attempt.finish_s is not None and not attempt.ok
        in_flight = sum(1 for a in self.attempts if a.sent_s is not None and a.finish_s is None)
        info = ProgressInfo(self.clock(), self.duration_s, sent, finished, failed, in_flight)
        self.progress(info)
