"""Simulator: engine model, batch-time profiles, cluster simulation and reports."""
