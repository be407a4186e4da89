"""Predicted refusals change no record (issue 23).

The batch formation tells DLPM which questions it would refuse without a lock
(:class:`~fairserve.sim.batching.PredictedRefusals`), and DLPM skips them and settles the
rest of a decision once nothing left could be admitted. Here the pinned configurations are
simulated with and without the predictions: the records must be the same, so the pinned
digests check the simulation and this checks that skipping questions is not part of it.
"""

from __future__ import annotations

import pytest

from fairserve.sim.batching import BatchFormer
from fairserve.sim.cluster import simulate
from tests.sim.test_records_equivalence import CASES, records_digest

DLPM_CASES = ["tot-overload", "chunked-sarathi", "dlpm-retracting", "max-running"]
"""The pinned DLPM configurations with chunked batching (where predictions are made): the
overload, a small token budget, retractions (an unsettled reservation ratio), a running
cap."""


@pytest.mark.parametrize("case", DLPM_CASES)
def test_predictions_change_no_record(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    workload, config, _pinned = CASES[case]
    predicted = records_digest(simulate(workload(), config))
    monkeypatch.setattr(BatchFormer, "predict_refusals", False)
    asked = records_digest(simulate(workload(), config))
    assert predicted == asked
