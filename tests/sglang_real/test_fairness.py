"""A flooding client and a light one over many batching steps with a small KV pool: under
DLPM inside SGLang the light client's waits stay bounded; with the plugin disabled, SGLang's
own LPM ordering puts the flood's cache hits first and the light client waits far longer."""

from __future__ import annotations

from tests.sglang_real.real import require_sglang

require_sglang()

from tests.sglang_real.harness import Engine, set_policy  # noqa: E402

STEPS = 150
ARRIVAL_STEPS = 110
FLOOD_PREFIX = [900 + i for i in range(60)]


def light_waits(policy: str | None) -> tuple[list[int], int]:
    """Steps each light request waited from arrival to admission (never admitted: counted
    until the end of the run), and the longest waiting queue seen."""
    set_policy(policy, 60.0 if policy == "dlpm" else None)
    engine = Engine(kv_tokens=700)
    arrived: dict[str, int] = {}
    admitted: dict[str, int] = {}
    longest = 0
    for step in range(STEPS):
        if step < ARRIVAL_STEPS:
            for k in range(3):
                start = 10_000 + step * 100 + k * 30
                engine.add(f"f{step}-{k}", [*FLOOD_PREFIX, *range(start, start + 20)], 16, "flood")
            if step % 5 == 0:
                rid = f"l{step}"
                engine.add(rid, range(50_000 + step * 100, 50_000 + step * 100 + 40), 16, "light")
                arrived[rid] = step
        record = engine.step()
        longest = max(longest, len(engine.waiting_queue))
        for rid in record.prefill.admitted if record.prefill else []:
            if rid in arrived and rid not in admitted:
                admitted[rid] = step
    waits = [admitted.get(rid, STEPS) - step for rid, step in arrived.items()]
    return waits, longest


def test_the_light_clients_waits_stay_bounded_under_dlpm() -> None:
    fair, fair_queue = light_waits("dlpm")
    unfair, unfair_queue = light_waits(None)
    assert min(fair_queue, unfair_queue) >= 30, "the flood must build a queue"
    # Measured: DLPM admits every light request within 17 steps (a few decode steps until
    # the running batch frees memory); SGLang alone admits the first and then none again.
    assert max(fair) <= 20, fair
    assert max(unfair) >= 5 * max(fair), (unfair, fair)
    assert sum(unfair) >= 5 * sum(fair), (unfair, fair)
