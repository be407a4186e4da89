"""The running bound a simulated worker takes when nothing sets one: how many requests it
runs at once.

One place for it, since two commands must agree on it: ``fairserve worker`` (the workers
``launch`` starts) and ``fairserve simulate`` / ``tune quantum --sweep``, whose predictions
are only worth reading if they run the batch the service runs.
"""

from __future__ import annotations

from fairserve.sim.profile import Profile

MIN_RUNNING_REQUESTS = 32
MAX_RUNNING_REQUESTS = 1024
STEP_TOKENS_PER_REQUEST = 5
"""Tokens a running request puts in each step of a mixed (chunked-prefill) batch, on
average: its decode token plus its prompt spread over its output steps, ``(P + O) / O``,
for prompts about four times the output (the soak's 126-token prompts and 32-token answers;
chat and RAG traffic runs 2 to 10)."""
FULL_STEP_FACTOR = 2.0
"""The latency target that sets the default running bound: under overload a full step
takes at most this many one-token steps, so every running request, a light tenant's
included, decodes at half its unloaded speed or better.

Measured with ``tests/perf/soak_router.py`` (2 workers, ``--speed 0.05``, 10 heavy and 40
light clients at 2x the measured capacity, 300 s after 120 s of light clients alone, one
bound after the other on a 2-core VM): bound 52 (a factor of 2) finished 0.64 of the
profile's peak with light clients' p99 1.61x their p99 alone, 92 (3) 0.78 and 1.78x, 132
and 172 0.78 and 0.82 (1.89x and 1.59x) with light p99s of 54 and 64 s against 40 s at 92. Past
3 the throughput barely grows while every request's latency does, alone and under load.
Why 2 and not 3: a larger batch also widens the service a client gets ahead of another
before the fair policy can answer (the batch turns over only as requests finish): the
README's showcase (``vtc-constant``, two clients at 1:2, 10 s of arrivals) measured Jain's
index 0.965 and a 1.47 service ratio at 92, against 0.98-0.99 at 52."""


def default_running_requests(profile: Profile) -> int:
    """How many requests the worker runs at once: the profile's value, else the largest
    batch whose full step meets :data:`FULL_STEP_FACTOR`.

    SGLang bounds its running batch (``--max-running-requests``, the KV pool, the token
    budget), so under overload requests queue and the running ones keep finishing. An
    unbounded simulated worker instead admits everything the KV pool holds (hundreds of
    thousands of requests): every step then takes seconds and nothing finishes.

    A step over ``b`` tokens takes ``overhead + c + a·(b − b0)``, so it takes ``F`` one-token
    steps at ``b0 + (F − 1)·(c + overhead)/a`` tokens; divided by the tokens each running
    request brings to a step (:data:`STEP_TOKENS_PER_REQUEST`: with chunked prefill a step
    carries the running requests' decode tokens *and* the new prompts' chunks), that is the
    bound. 52 for ``a100-llama-3-8b``. Why not more: at ``b`` tokens a step a batch-time
    line gives the fraction ``b / (b − b0 + (c + overhead)/a)`` of its peak throughput
    (``1/a`` tokens/s), so 90% of the peak needs ``b ≈ 9·((c + overhead)/a − b0)``, steps
    of about seven one-token steps for ``a100-llama-3-8b``, and light tenants' requests,
    which share every step, would take several times their latency alone. The target
    trades that off (figures at :data:`FULL_STEP_FACTOR`). Kept within [32, 1024].

    ``fairserve worker`` (what ``launch`` starts) and ``fairserve simulate`` / ``tune
    quantum --sweep`` (:class:`~fairserve.sim.compare.Bench`) both use it, so a prediction
    is made with the batch the service runs; the paper table and the simulator's own
    tests set their engine configuration themselves.
    """
    if profile.max_running_requests is not None:
        return profile.max_running_requests
    step_s = profile.c_s + profile.step_overhead_s
    if profile.a_s_per_token <= 0:
        return MAX_RUNNING_REQUESTS
    target_tokens = profile.b0_tokens + (FULL_STEP_FACTOR - 1.0) * step_s / profile.a_s_per_token
    running = round(target_tokens / STEP_TOKENS_PER_REQUEST)
    return int(min(MAX_RUNNING_REQUESTS, max(MIN_RUNNING_REQUESTS, running)))
