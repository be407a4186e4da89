"""A scripted state source and a deterministic scenario for the dashboard's tests.

The scenario is built as the JSON a router and its workers send (then parsed by the real
parsers), so snapshot tests exercise the same path as a live router, with fixed numbers
and a fixed timeline (``uptime_s`` advances one second per poll; no clock is read).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fairserve.profiling.nvml import GpuReading
from fairserve.tui.model import GpuView, Quanta, Snapshot
from fairserve.tui.parse import parse_state, parse_worker_state
from fairserve.tui.source import QuantumRefused, SourceError

WORKERS = ("http://10.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000")
CLIENTS: dict[str, dict[str, float]] = {
    # name: weight, service units per second, cache hit share, latency p50 (s)
    "alice": {"weight": 1.0, "rate": 900.0, "hit": 0.72, "p50": 0.42},
    "bob": {"weight": 1.0, "rate": 610.0, "hit": 0.35, "p50": 0.31},
    "carol": {"weight": 2.0, "rate": 1180.0, "hit": 0.55, "p50": 0.27},
    "dave-batch": {"weight": 0.5, "rate": 150.0, "hit": 0.05, "p50": 2.4},
}


def client_json(name: str, t_s: float, index: int) -> dict[str, Any]:
    spec = CLIENTS[name]
    wave = 1.0 + 0.25 * math.sin(t_s / 4.0 + index)
    prompt = int(spec["rate"] * t_s * 0.6)
    return {
        "weight": spec["weight"],
        "requests": int(t_s * 3) + index,
        "finished": int(t_s * 3),
        "failed": 0,
        "aborted": 0,
        "rejected": 7 if name == "dave-batch" else 0,
        "in_flight": 2 + index,
        "queued": 1 if name == "alice" else 0,
        "queue_depth": 3 + index,
        "prompt_tokens": prompt,
        "cached_tokens": int(prompt * spec["hit"] * (0.9 + 0.1 * wave)),
        "output_tokens": int(spec["rate"] * t_s * 0.2),
        "service": spec["rate"] * t_s,
        "service_rate": round(spec["rate"] * wave, 3),
        "requests_per_s": 3.0,
        "tokens_per_s": spec["rate"] * 0.8,
        "latency_p50_s": spec["p50"],
        "latency_p99_s": spec["p50"] * 4.5,
        "ttft_p50_s": spec["p50"] / 6,
        "ttft_p99_s": spec["p50"] / 1.5,
        "deficits": {
            WORKERS[0]: 1800.0 - 400.0 * index,
            WORKERS[1]: -300.0 if name == "alice" else 2048.0,
            WORKERS[2]: 950.0,
        },
    }


def worker_json(url: str, t_s: float, index: int) -> dict[str, Any]:
    prompt = int(9000 * t_s * (index + 1) / 2)
    return {
        "url": url,
        "healthy": index != 2,
        "probed": True,
        "fairness": "inside",
        "extension": True,
        "models": ["demo/model"],
        "max_total_tokens": 200000,
        "capacity_tokens_per_s": 12000.0,
        "outstanding": 4 + index,
        "outstanding_tokens": 900,
        "in_flight": 4 + index,
        "dispatched": int(t_s * 4),
        "requests": int(t_s * 4),
        "finished": int(t_s * 4),
        "failures": 3 if index == 2 else 0,
        "retried": 0,
        "prompt_tokens": prompt,
        "cached_tokens": int(prompt * (0.6 - 0.15 * index)),
        "output_tokens": int(2000 * t_s),
        "cache_hit_rate": 0.6 - 0.15 * index,
        "last_error": "connection refused" if index == 2 else None,
    }


def state_json(t_s: float, quantum: float | None = None) -> dict[str, Any]:
    """A router's ``/fairserve/v1/state`` at uptime ``t_s`` (JSON-safe, like the router's)."""
    return {
        "router": {
            "url": "http://127.0.0.1:8000",
            "version": "0.1.0",
            "uptime_s": t_s,
            "draining": False,
            "active_requests": 12,
            "dispatch": "doubleq",
            "policy": "dlpm",
            "router_queue": "auto",
        },
        "quantum": {"dispatch": "doubleq", "worker_quantum": 2048.0, "policy": "dlpm",
                    "quantum": quantum},
        "jain_index": 0.94,
        "jain_window_s": [12.0, t_s],
        "max_service_gap": 1830.0,
        "throughput": {"requests_per_s": 12.0, "tokens_per_s": 23400.0, "service_per_s": 2840.0},
        "clients": {name: client_json(name, t_s, i) for i, name in enumerate(CLIENTS)},
        "workers": [worker_json(url, t_s, i) for i, url in enumerate(WORKERS)],
        "dispatcher": {"dispatch": "doubleq"},
    }  # fmt: skip


def worker_state_json(index: int) -> dict[str, Any]:
    """A worker's ``/fairserve/worker/state`` (the parts the dashboard reads)."""
    return {
        "policy": {"policy": "dlpm", "quantum": 512.0},
        "waiting": 3 - index,
        "running": 8 + index,
        "clients": {
            name: {"waiting": 1 if name == "alice" else 0, "running": 2 + index} for name in CLIENTS
        },
        "kv": {"used_tokens": 50000.0 * (index + 1), "capacity_tokens": 200000.0},
        "speed": 1.0,
        "gpu": {"index": index, "uuid": f"GPU-{index:04d}"},
    }


GPUS = (
    GpuReading(0, "NVIDIA H100 80GB HBM3", "GPU-0000", 87.0, 61440.0, 81559.0, 512.0,
               1980.0, 1.0e9, ()),
    GpuReading(1, "NVIDIA H100 80GB HBM3", "GPU-0001", None, 30720.0, 81559.0, None,
               None, None, ()),
    GpuReading(7, "NVIDIA H100 80GB HBM3", "GPU-0007", 0.0, 512.0, 81559.0, 71.0,
               345.0, None, ("gpu_idle",)),
)  # fmt: skip


def scenario(points: int = 40, quantum: float | None = None) -> list[Snapshot]:
    """``points`` polls one second apart: three workers (the third down), four clients,
    GPUs 0 and 1 under workers 0 and 1, GPU 7 local but claimed by no worker."""
    probes = {url: parse_worker_state(worker_state_json(i)) for i, url in enumerate(WORKERS[:2])}
    gpus = tuple(GpuView.of(g) for g in GPUS)
    return [
        parse_state(state_json(60.0 + t, quantum)).with_probes(probes).with_gpus(gpus)
        for t in range(points)
    ]


class FakeStateSource:
    """Hands out scripted snapshots (an exception in the script is raised instead); after
    the script, the last item again, or with ``hold`` a poll that never returns (the app
    then stays exactly as the script left it, for screenshots). Quantum writes are
    recorded and show in the snapshots that follow, like a router's would."""

    def __init__(
        self,
        script: Sequence[Snapshot | SourceError],
        url: str = "http://127.0.0.1:8000",
        token: str | None = "admin",
        hold: bool = False,
    ) -> None:
        self.script = list(script)
        self.hold = hold
        self._url = url
        self.token = token
        self.fetches = 0
        self.writes: list[tuple[float | None, float | None]] = []
        self.quanta: Quanta | None = None
        self.closed = False

    @property
    def url(self) -> str:
        return self._url

    @property
    def done(self) -> bool:
        """Every scripted item was handed out."""
        return self.fetches >= len(self.script)

    async def fetch(self) -> Snapshot:
        if self.hold and self.done:
            await asyncio.Event().wait()  # cancelled when the app exits
        item = self.script[min(self.fetches, len(self.script) - 1)]
        self.fetches += 1
        if isinstance(item, SourceError):
            raise item
        return item if self.quanta is None else replace(item, quanta=self.quanta)

    async def set_quanta(
        self, quantum: float | None = None, worker_quantum: float | None = None
    ) -> Quanta:
        if self.token is None:
            raise QuantumRefused("HTTP 401: admin token required")
        self.writes.append((quantum, worker_quantum))
        base = self.quanta
        if base is None:
            last = self.script[-1]
            base = last.quanta if isinstance(last, Snapshot) else Quanta()
        self.quanta = Quanta(
            quantum if quantum is not None else base.quantum,
            worker_quantum if worker_quantum is not None else base.worker_quantum,
        )
        return self.quanta

    async def close(self) -> None:
        self.closed = True
