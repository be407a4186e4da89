"""Turning the fairness knobs: live quantum control, the auto-tuner, offline sweeps, weights.

The quantum ``Q^u`` trades locality (throughput) for fairness (the service-gap bound
``2·(U + Q^u)`` per worker, ``2·|W|·(U + Q^u)`` across workers). This package makes it safe to
turn while traffic flows:

* :mod:`~fairserve.tuning.client`: the router's admin API over HTTP (run file or ``--url``);
* :mod:`~fairserve.tuning.bounds`: what a quantum implies, in tokens and in seconds;
* :mod:`~fairserve.tuning.observe` and :mod:`~fairserve.tuning.controller`: pure decision
  logic of the auto-tuner (no I/O, unit-testable), driven by :mod:`~fairserve.tuning.auto`;
* :mod:`~fairserve.tuning.sweep`: replay a workload or a recorded trace in the simulator
  for a grid of quanta, mark the Pareto front and recommend one.
"""
