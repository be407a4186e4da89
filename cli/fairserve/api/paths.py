"""Route paths: the OpenAI/SGLang-compatible API every server speaks, the router's admin
API and the worker extension (DESIGN §5). One table: the router's front and proxy, the
simulated worker, the load generator and the health probes all read their paths here."""

from __future__ import annotations

from fairserve.core.openai_api import Route

# ------------------------------------------------------------------ OpenAI/SGLang-compatible
CHAT_COMPLETIONS = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GENERATE = "/generate"
MODELS = "/v1/models"
HEALTH = "/health"
METRICS = "/metrics"

GENERATION: dict[Route, str] = {
    "chat": CHAT_COMPLETIONS,
    "completions": COMPLETIONS,
    "generate": GENERATE,
}
"""The generation routes by kind (``core.openai_api.Route``): what the router serves and
forwards, and what the load generator sends."""

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
