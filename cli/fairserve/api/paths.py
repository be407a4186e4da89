"""Route paths of the router's admin API and of the worker extension (DESIGN §5)."""

from __future__ import annotations

# ------------------------------------------------------------------ router admin API
ROUTER_STATE = "/fairserve/v1/state"
ROUTER_QUANTUM = "/fairserve/v1/quantum"
ROUTER_WEIGHTS = "/fairserve/v1/weights"

# ------------------------------------------------------------------ worker extension
WORKER_STATE = "/fairserve/worker/state"
WORKER_QUANTUM = "/fairserve/worker/quantum"
WORKER_WEIGHTS = "/fairserve/worker/weights"
WORKER_EVICTIONS = "/fairserve/worker/evictions"

# ------------------------------------------------------------------ SGLang-compatible control
ABORT_REQUEST = "/abort_request"
FLUSH_CACHE = "/flush_cache"
