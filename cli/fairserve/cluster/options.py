"""``fairserve launch``'s options as one JSON-able record.

The foreground launch, the detached supervisor (which gets them in a file) and the plan
all read the same record, so an option added to ``launch`` is saved and restored with the
others.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fairserve.router.config import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_FIRST_BYTE_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_OUTSTANDING,
    DEFAULT_METRICS_MAX_CLIENTS,
    DEFAULT_OUTLIER_FAILURES,
    DEFAULT_QUEUE_CAP,
    DEFAULT_QUEUE_TIMEOUT_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_STALL_TIMEOUT_S,
    DEFAULT_TOTAL_CAP,
)


@dataclass
class LaunchOptions:
    """``fairserve launch``'s options, as given (JSON-able: the detached supervisor gets
    them in a file)."""

    engine: str | None = None
    workers: int | None = None
    """None: two simulated workers, or one SGLang server per ``tp`` GPUs."""
    gpus: str | None = None
    tp: int = 1
    model: str | None = None
    policy: str = "dlpm"
    dispatch: str = "doubleq"
    quantum: float | None = None
    worker_quantum: float | None = None
    profile: str | None = None
    clients: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    worker_urls: list[str] = field(default_factory=list)
    record: str | None = None
    speed: float = 1.0
    ready_timeout_s: float = 60.0
    """``launch`` passes :func:`~fairserve.cluster.plan.default_ready_timeout_s` unless
    ``--ready-timeout`` is given."""
    sglang_args: list[str] = field(default_factory=list)
    """Extra ``sglang.launch_server`` arguments (after ``--`` on the command line)."""
    queue_cap: int = DEFAULT_QUEUE_CAP
    total_cap: int = DEFAULT_TOTAL_CAP
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    router_queue: str = "auto"
    max_outstanding_per_worker: int = DEFAULT_MAX_OUTSTANDING
    metrics_max_clients: int = DEFAULT_METRICS_MAX_CLIENTS
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    trust_identity_header: bool = False
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    first_byte_timeout_s: float = DEFAULT_FIRST_BYTE_TIMEOUT_S
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S
    outlier_failures: int = DEFAULT_OUTLIER_FAILURES
    ray_address: str | None = None
    """``--ray [ADDRESS]``: place the workers on this Ray cluster (``auto``: ``RAY_ADDRESS``
    or the cluster started on this host); None: workers run on this host."""
    gpus_per_worker: int | None = None
    """``--gpus-per-worker`` (Ray, simulated workers): GPUs each reserves (default 1)."""

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> LaunchOptions:
        return cls(**json.loads(path.read_text(encoding="utf-8")))
