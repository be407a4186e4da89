"""Profiling: NVML readings, the batch-time sweep against a worker URL, the fit, the store.

This is the only package that imports NVML (``pynvml`` from nvidia-ml-py), and only lazily
inside :mod:`fairserve.profiling.nvml`, so a CPU host without the driver library imports it
fine and every GPU field simply reads "n/a".
"""
