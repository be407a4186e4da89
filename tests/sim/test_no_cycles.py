"""A simulated run leaves no reference cycles among the engine's objects (issue 23).

Why: the event loop runs with the cyclic collector relaxed (``sim.cluster._relaxed_gc``), so
anything a step leaves in a cycle lives until a collection finds it, and with it everything
it references. A batch formation's match reader and its predicted refusals referred to each
other: every decision's batch, and through its chunks the slots and requests it admitted,
outlived the step (a simulated hour kept every request alive until a collection, and the
collections walking them cost about a tenth of its CPU). Objects of the workload's own
generators (numpy's) are not the engine's and are left out.
"""

from __future__ import annotations

import gc
from collections import Counter

from fairserve.sim.cluster import ClusterSim
from tests.sim.test_records_equivalence import CASES

ENGINE_MODULES = ("fairserve.sim", "fairserve.sched", "fairserve.core")


def _engine_garbage(case: str) -> Counter[str]:
    """Types of the engine's objects only a cycle collection would free after ``case`` ran."""
    make, config, _ = CASES[case]
    sim = ClusterSim(make(), config)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        sim.run()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
    finally:
        gc.set_debug(0)
        if enabled:
            gc.enable()
    found = Counter(
        type(obj).__qualname__
        for obj in gc.garbage
        if type(obj).__module__.startswith(ENGINE_MODULES)
    )
    gc.garbage.clear()
    return found


def test_chunked_dlpm_run_leaves_no_engine_cycles() -> None:
    assert _engine_garbage("dlpm-retracting") == Counter()


def test_vtc_run_leaves_no_engine_cycles() -> None:
    assert _engine_garbage("vtc-client-rr") == Counter()
