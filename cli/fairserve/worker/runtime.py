"""The simulated engine driven by the wall clock: one asyncio task steps it in real time.

Simulated time is ``virtual = (monotonic − t0) · speed``. The driver loop:

1. with no work, wait on an event that ``submit`` sets (no polling, no busy loop);
2. ``engine.step(start)`` without a horizon, so a step is one token per running request
   and streams advance token by token;
3. sleep until the wall-clock moment of ``result.end_s``: an *absolute* deadline, so sleep
   overshoot does not accumulate (a late step is followed by shorter sleeps);
4. deliver the step's tokens and finishes to the waiting handlers.

Back-to-back steps start where the previous one ended. When the host cannot keep up (a
high ``--speed``, a slow machine) and falls more than ``max_lag_s`` behind, simulated time
*slips*: the clock is re-anchored so the engine never runs a burst of catch-up steps, and
``slip_s`` says how much simulated time was given up. At ``--speed 1`` on an idle machine
the slip stays near zero and a request's wall latency matches its simulated latency.

An exception inside the loop never kills it silently: it is logged, every in-flight
request fails with an error (HTTP 500) and a fresh engine replaces the broken one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

from fairserve.core.errors import FairserveError
from fairserve.core.openai_api import GenerationSpec, check_context
from fairserve.core.tokenizer import SyntheticOutput, token_key
from fairserve.core.types import Request, key_len
from fairserve.sim.engine import Engine, StepResult
from fairserve.worker.config import WorkerConfig, build_engine
from fairserve.worker.evictions import EvictionLog, TextPrompts

log = logging.getLogger("fairserve.worker")

Clock = Callable[[], float]
EngineFactory = Callable[[WorkerConfig], Engine]
FinishHook = Callable[["Ticket"], None]

_STALLED_POLL_S = 0.01
"""Wall seconds between retries when the engine has work but nothing can run."""


class Unavailable(FairserveError):
    """The worker is shutting down or its loop is not running (HTTP 503)."""


class DuplicateRequest(FairserveError):
    """A request id that is already in flight (HTTP 400)."""


class Ticket:
    """One in-flight request as its HTTP handler sees it: progress, then an outcome."""

    def __init__(self, spec: GenerationSpec, req: Request, output: SyntheticOutput) -> None:
        self.spec = spec
        self.req = req
        self.output = output
        self.produced = 0
        """Visible output tokens so far (never more than ``spec.max_new_tokens``)."""
        self.finish_reason: dict[str, Any] | None = None
        self.error: str | None = None
        self._changed = asyncio.Event()
        self._ended = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    @property
    def latency_s(self) -> float | None:
        """Simulated end-to-end latency (arrival to last token)."""
        if self.req.finish_s is None:
            return None
        return self.req.finish_s - self.req.arrival_s

    @property
    def ttft_s(self) -> float | None:
        if self.req.first_token_s is None:
            return None
        return self.req.first_token_s - self.req.arrival_s

    async def next_change(self) -> None:
        """Wait until new tokens arrived or the request ended."""
        await self._changed.wait()
        self._changed.clear()

    async def wait_done(self) -> None:
        """Wait for the outcome only (one wake-up, not one per token)."""
        await self._ended.wait()

    def advance(self, output_tokens: int) -> None:
        self.produced = min(output_tokens, self.spec.max_new_tokens)
        self._changed.set()

    def finish(self, reason: dict[str, Any]) -> None:
        self.finish_reason = reason
        self._changed.set()
        self._ended.set()

    def fail(self, message: str) -> None:
        self.error = message
        self._changed.set()
        self._ended.set()


class WorkerRuntime:
    """Owns the engine, the clock, the in-flight tickets and the eviction log."""

    def __init__(
        self,
        config: WorkerConfig,
        engine_factory: EngineFactory = build_engine,
        clock: Clock = time.monotonic,
    ) -> None:
        self.config = config
        self._factory = engine_factory
        self._clock = clock
        self.engine = engine_factory(config)
        self.evictions = EvictionLog()
        self.text_prompts = TextPrompts()
        """Text prompts by their tokens: evictions are published in the router's keys."""
        self.finish_hooks: list[FinishHook] = []
        self._tickets: dict[str, Ticket] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._busy = False
        self._t0 = clock()
        self._engine_s = 0.0
        self.slip_s = 0.0
        self.engine_errors = 0
        self.last_step_wall_s = self._t0

    # ---------------------------------------------------------------- clock
    def virtual_now(self) -> float:
        return (self._clock() - self._t0) * self.config.speed

    def _wall_of(self, virtual_s: float) -> float:
        return self._t0 + virtual_s / self.config.speed

    def _arrival_s(self) -> float:
        """Arrivals during a step are seen by the next one, which starts at its end."""
        now = self.virtual_now()
        return min(now, self._engine_s) if self._busy else now

    def _step_start_s(self) -> float:
        now = self.virtual_now()
        if not self._busy:
            return max(now, self._engine_s)
        lag_s = now - self._engine_s
        if lag_s > self.config.max_lag_s * self.config.speed:
            self._t0 += lag_s / self.config.speed  # slip: simulated time slows down
            self.slip_s += lag_s
        return self._engine_s

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine")

    @property
    def running(self) -> bool:
        """The loop task is alive (``/health``)."""
        return self._task is not None and not self._task.done()

    @property
    def accepting(self) -> bool:
        return self.running and not self._closing

    async def drain(self, timeout_s: float, reason: str = "worker shutting down") -> None:
        """Refuse new requests, let in-flight ones finish for up to ``timeout_s`` wall
        seconds, then abort the rest."""
        self._closing = True
        deadline = self._clock() + timeout_s
        while self._tickets and self._clock() < deadline:
            await asyncio.sleep(min(0.02, max(0.0, deadline - self._clock())))
        for rid in list(self._tickets):
            self.abort(rid, reason)

    async def stop(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for ticket in self._tickets.values():
            ticket.fail("worker stopped")
        self._tickets.clear()

    # ---------------------------------------------------------------- requests
    def submit(self, spec: GenerationSpec) -> Ticket:
        """Queue a request; raises ApiError (400: beyond the context length),
        RequestRejected (429), ConfigError (400: never fits), DuplicateRequest (400) or
        Unavailable (503).

        Costs the same whatever ``max_new_tokens``: the output is drawn as it is produced
        (``SyntheticOutput``), and the engine reads its key only when the request ends."""
        if not self.accepting:
            raise Unavailable("worker is shutting down" if self._closing else "engine not running")
        # The engine's tokens: the client's ids, or the text tokenized here (the router keys
        # text by its blocks and only estimates tokens; the worker's count is the real one).
        prompt_key = spec.prompt_key if spec.prompt_text is None else token_key(spec.prompt_text)
        check_context(spec, self.config.context_length, key_len(prompt_key))
        if spec.rid in self._tickets:
            raise DuplicateRequest(f"rid {spec.rid!r}: a request with this id is in flight")
        if spec.prompt_text is not None:
            self.text_prompts.add(prompt_key, spec.prompt_text)
        engine_tokens = max(1, spec.max_new_tokens)  # a step yields a token even for 0
        output = SyntheticOutput(spec.rid, engine_tokens)
        req = Request(
            id=spec.rid,
            client=spec.client,
            prompt_key=prompt_key,
            max_output_tokens=engine_tokens,
            app=spec.app,
            output_len=engine_tokens,
        )
        # The engine takes bytes but only measures and slices an output key (sim.kvpool).
        self.engine.submit(req, self._arrival_s(), cast(bytes, output.lazy_key()))
        ticket = Ticket(spec, req, output)
        self._tickets[spec.rid] = ticket
        self._wake.set()
        return ticket

    def abort(self, rid: str, reason: str) -> bool:
        """End an in-flight request (client gone, ``/abort_request``); False if unknown."""
        ticket = self._tickets.pop(rid, None)
        if ticket is None:
            return False
        self.engine.abort(rid, self.virtual_now())
        self._drain_evictions()
        ticket.finish({"type": "abort", "message": reason})
        return True

    def abort_all(self, reason: str) -> int:
        rids = list(self._tickets)
        for rid in rids:
            self.abort(rid, reason)
        return len(rids)

    def flush_cache(self) -> bool:
        """Drop the prefix cache; refused while requests wait or run (as SGLang does)."""
        if self.engine.has_work or not self.engine.flush_cache():
            return False
        self._drain_evictions()
        return True

    def in_flight(self) -> int:
        return len(self._tickets)

    # ---------------------------------------------------------------- loop
    async def _run(self) -> None:
        while True:
            try:
                await self._iteration()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the loop must survive anything a step raises
                self._engine_failed(exc)

    async def _iteration(self) -> None:
        if not self.engine.has_work:
            self._busy = False
            self._wake.clear()
            await self._wake.wait()
            return
        result = self.engine.step(self._step_start_s())
        if result is None:  # work that cannot run yet (nothing running frees memory soon)
            self._busy = False
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _STALLED_POLL_S)
            return
        self._busy = True
        self._engine_s = result.end_s
        self._drain_evictions()
        delay_s = self._wall_of(result.end_s) - self._clock()
        await asyncio.sleep(max(0.0, delay_s))  # sleep(0) still lets handlers run
        self.last_step_wall_s = self._clock()
        self._deliver(result)

    def _deliver(self, result: StepResult) -> None:
        for req, _tokens in result.decoded:
            ticket = self._tickets.get(req.id)
            if ticket is not None and ticket.req is req:
                ticket.advance(req.output_tokens)
        for req in result.finished:
            ticket = self._tickets.get(req.id)
            if ticket is None or ticket.req is not req:
                continue
            del self._tickets[req.id]
            ticket.advance(req.output_tokens)
            ticket.finish({"type": "length", "length": ticket.produced})
            for hook in self.finish_hooks:
                hook(ticket)

    def _drain_evictions(self) -> None:
        events = self.engine.pool.drain_evictions()
        if events:
            self.evictions.extend([self.text_prompts.router_key(key) for key in events])

    def _engine_failed(self, exc: Exception) -> None:
        """Fail everything in flight and start over with a fresh engine (same quantum and
        weights: they may have been changed live, and the router will not push them again)."""
        self.engine_errors += 1
        error_id = uuid.uuid4().hex[:12]
        log.error(
            "simulated engine failed (error id %s); failing %d request(s)",
            error_id,
            len(self._tickets),
            exc_info=exc,
        )
        # The cause stays in the log: clients get the id, never the exception's text.
        message = f"the simulated engine failed (error id {error_id}); the details are in the log"
        for ticket in self._tickets.values():
            ticket.fail(message)
        self._tickets.clear()
        quantum, weights = self.engine.policy.quantum, dict(self.engine.policy.weights)
        self.engine = self._factory(self.config)
        if quantum is not None:
            self.engine.policy.set_quantum(quantum)
        for client, weight in weights.items():
            self.engine.policy.set_weight(client, weight)
        self.evictions.extend([b""])  # the new engine's cache is empty
        self._busy = False

    # ---------------------------------------------------------------- state
    def state(self) -> dict[str, Any]:
        """JSON-able snapshot for ``/fairserve/worker/state`` and dashboards."""
        engine, profile = self.engine, self.config.profile
        running: dict[str, int] = {}
        for slot in engine.running:
            running[slot.req.client] = running.get(slot.req.client, 0) + 1
        waiting = engine.waiting_by_client()
        stats = engine.stats
        return {
            "policy": engine.policy.snapshot(),
            "engine": {
                "steps": stats.steps,
                "busy_s": stats.busy_s,
                "prompt_tokens": stats.prompt_tokens,
                "cached_tokens": stats.cached_tokens,
                "prefill_tokens": stats.prefill_tokens,
                "decode_tokens": stats.decode_tokens,
                "admitted": stats.admitted,
                "finished": stats.finished,
                "retracted": stats.retracted,
                "aborted": stats.aborted,
                "cache_hit_rate": stats.cache_hit_rate,
                "errors": self.engine_errors,
            },
            "waiting": len(engine.waiting),
            "running": len(engine.running),
            "clients": {
                c: {"waiting": waiting.get(c, 0), "running": running.get(c, 0)}
                for c in sorted(set(waiting) | set(running))
            },
            "kv": {
                "used_tokens": engine.pool.used_tokens,
                "capacity_tokens": engine.pool.capacity_tokens,
            },
            "profile": {
                "name": profile.name,
                "gpu": profile.gpu,
                "model": profile.model,
                "kv_capacity_tokens": profile.kv_capacity_tokens,
                "max_batch_tokens": profile.max_batch_tokens,
                # What the worker enforces: the profile's value or the step-target default.
                "max_running_requests": engine.config.max_running_requests,
            },
            "batching": self.config.batching,
            "speed": self.config.speed,
            "virtual_time_s": self.virtual_now(),
            "slip_s": self.slip_s,
            "evictions_next": self.evictions.next_seq,
        }
