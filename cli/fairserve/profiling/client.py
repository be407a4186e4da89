"""The HTTP calls a sweep makes to one worker (SGLang's API and the fairserve extension).

Two ways to time steps, picked per worker:

* ``engine`` timing reads the worker's own step counters (``/fairserve/worker/state``:
  ``engine.steps``, ``engine.busy_s``, token counts), which fairserve's simulated workers
  and SGLang workers running the fairserve plugin expose. They are engine seconds summed by
  the engine itself, so neither the network, nor this host's load, nor a simulated worker's
  ``--speed`` adds noise: the must-have on a busy 2-core CI box.
* ``client`` timing, for a plain SGLang worker: ``meta_info.e2e_latency`` (engine seconds
  measured by the server) for prefill, and streamed token arrival times, scaled by the
  worker's speed (``fairserve.speed`` in its server info, 1 for a real GPU), over a long
  decode window for decode.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from fairserve.api import paths
from fairserve.core.errors import ConfigError, FairserveError

PROBE_TIMEOUT_S = 10.0


class WorkerUnreachable(ConnectionError):
    """Nothing answers at the worker URL (exit code 3 through ``commands.errors``)."""


class WorkerError(FairserveError):
    """The worker answered with an error the sweep cannot work around."""


@dataclass(frozen=True)
class EngineCounters:
    """One snapshot of a worker's cumulative step counters."""

    steps: int
    busy_s: float
    prefill_tokens: int
    decode_tokens: int
    cached_tokens: int
    running: int
    waiting: int

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> EngineCounters | None:
        engine = state.get("engine")
        if not isinstance(engine, dict):
            return None
        try:
            return cls(
                steps=int(engine["steps"]),
                busy_s=float(engine["busy_s"]),
                prefill_tokens=int(engine["prefill_tokens"]),
                decode_tokens=int(engine["decode_tokens"]),
                cached_tokens=int(engine.get("cached_tokens", 0)),
                running=int(state["running"]),
                waiting=int(state["waiting"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0


@dataclass(frozen=True)
class Generation:
    """One finished ``/generate`` call."""

    e2e_s: float | None
    """``meta_info.e2e_latency``: engine seconds from arrival to last token (server side)."""
    wall_s: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    token_times_s: tuple[tuple[float, int], ...] = ()
    """Streamed calls: ``(monotonic wall time, output tokens so far)`` per chunk."""


def normalize_url(url: str) -> str:
    """``http(s)://host:port`` without a trailing ``/`` (paths are added here)."""
    text = url.strip().rstrip("/")
    if not text.startswith(("http://", "https://")):
        raise ConfigError(f"--url: expected an http:// or https:// URL, got {url!r}")
    return text.removesuffix("/v1")


class WorkerClient:
    """A worker's endpoints over one aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession, url: str, timeout_s: float) -> None:
        self.session = session
        self.url = normalize_url(url)
        self.timeout_s = timeout_s

    async def server_info(self) -> dict[str, Any]:
        """``/get_server_info`` (or SGLang's newer ``/server_info``); proves reachability."""
        limit = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        for path in ("/get_server_info", "/server_info"):
            try:
                async with self.session.get(self.url + path, timeout=limit) as resp:
                    if resp.status == 404:
                        continue
                    if resp.status != 200:
                        raise WorkerError(f"{self.url}{path}: HTTP {resp.status}")
                    body = await resp.json(content_type=None)
            except (aiohttp.ClientConnectionError, OSError, TimeoutError) as exc:
                detail = str(exc) or type(exc).__name__
                raise WorkerUnreachable(
                    f"cannot reach worker {self.url}: {detail} (is it running?)"
                ) from None
            if not isinstance(body, dict):
                raise WorkerError(f"{self.url}{path}: expected a JSON object")
            return body
        raise WorkerError(f"{self.url}: no /get_server_info: is this an SGLang worker?")

    async def counters(self) -> EngineCounters | None:
        """The step counters, or ``None`` when the worker does not expose them."""
        async with self.session.get(self.url + paths.WORKER_STATE) as resp:
            if resp.status != 200:
                await resp.read()
                return None
            try:
                body = await resp.json(content_type=None)
            except (json.JSONDecodeError, aiohttp.ContentTypeError):
                return None
        return EngineCounters.from_state(body) if isinstance(body, dict) else None

    async def flush_cache(self) -> bool:
        """Drop the worker's prefix cache; False when it refuses (busy) or has no such call."""
        async with self.session.post(self.url + "/flush_cache") as resp:
            await resp.read()
            return resp.status == 200

    async def generate(
        self, input_ids: list[int], max_new_tokens: int, stream: bool = False
    ) -> Generation:
        """One ``/generate`` with ``ignore_eos`` so exactly ``max_new_tokens`` come back."""
        body = {
            "input_ids": input_ids,
            "sampling_params": {
                "max_new_tokens": max_new_tokens,
                "ignore_eos": True,
                "temperature": 0.0,
            },
            "stream": stream,
        }
        limit = aiohttp.ClientTimeout(total=self.timeout_s)
        start = time.monotonic()
        times: list[tuple[float, int]] = []
        async with self.session.post(self.url + paths.GENERATE, json=body, timeout=limit) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                if resp.status == 503:  # shutting down, engine stopped: exit code 3
                    raise WorkerUnreachable(f"{self.url}/generate: worker unavailable: {text}")
                raise WorkerError(f"{self.url}/generate: HTTP {resp.status}: {text}")
            if stream:
                last = await _read_stream(resp, times)
            else:
                last = await resp.json(content_type=None)
        wall_s = time.monotonic() - start
        return _generation(last, wall_s, len(input_ids), tuple(times))


async def _read_stream(resp: aiohttp.ClientResponse, times: list[tuple[float, int]]) -> Any:
    """Read SSE chunks, noting when each one arrived and how many tokens it carried."""
    last: Any = None
    async for raw in resp.content:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        meta = chunk.get("meta_info", {}) if isinstance(chunk, dict) else {}
        tokens = meta.get("completion_tokens")
        if isinstance(tokens, int):
            times.append((time.monotonic(), tokens))
        last = chunk
    return last


def _generation(
    body: Any, wall_s: float, prompt_tokens: int, times: tuple[tuple[float, int], ...]
) -> Generation:
    meta = body.get("meta_info", {}) if isinstance(body, dict) else {}
    if not isinstance(meta, dict):
        meta = {}
    e2e = meta.get("e2e_latency")
    return Generation(
        e2e_s=float(e2e) if isinstance(e2e, int | float) and e2e > 0 else None,
        wall_s=wall_s,
        prompt_tokens=int(meta.get("prompt_tokens", prompt_tokens)),
        completion_tokens=int(meta.get("completion_tokens", 0)),
        cached_tokens=int(meta.get("cached_tokens", 0) or 0),
        token_times_s=times,
    )
