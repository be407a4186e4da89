"""``fairserve profile --plot``: the measurements against the fitted batch-time model.

Left: mean step time against token load, with the attention term of each measurement taken
out (so decode windows with long contexts sit on the same line as prefill), and the fitted
``K + a·max(0, b − b0)`` over it with ``b0`` marked. Right: residuals per measurement, where
a systematic bend shows a load range the model does not capture. matplotlib is the optional
``plot`` extra, imported only here (``fairserve.sim.plot.check_plot_path`` checks it first).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fairserve.profiling.fit import BatchTimeFit
from fairserve.profiling.observations import KINDS, Observation

_MARKERS = {"prefill": "o", "decode": "s", "mixed": "^"}


def plot_fit(
    observations: Sequence[Observation], fit: BatchTimeFit, path: Path, title: str
) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2)
    for kind in KINDS:
        chosen = [o for o in observations if o.kind == kind]
        if not chosen:
            continue
        loads = [o.mean_load_tokens for o in chosen]
        corrected = [
            1e3 * (o.mean_step_s - fit.attention_s_per_token * o.mean_context_tokens)
            for o in chosen
        ]
        left.scatter(loads, corrected, marker=_MARKERS[kind], label=kind, alpha=0.7)
        residuals = [1e3 * fit_residual(o, fit) for o in chosen]
        right.scatter(loads, residuals, marker=_MARKERS[kind], label=kind, alpha=0.7)
    top = max(o.mean_load_tokens for o in observations)
    bottom = min(o.mean_load_tokens for o in observations)
    grid = np.geomspace(max(1.0, bottom), top, 400)
    left.plot(grid, [1e3 * fit.step_s(b) for b in grid], color="black", label="fit")
    left.axvline(fit.b0_tokens, color="grey", linestyle=":", label=f"b0 = {fit.b0_tokens}")
    left.set(xlabel="token load per step", ylabel="step time, attention removed (ms)")
    left.set_title(f"R² = {fit.r2:.4f}, {fit.points} points")
    left.legend()
    for axes in (left, right):  # the knee at b0 sits at small loads: a log axis shows it
        axes.set_xscale("log")
    right.axhline(0.0, color="black", linewidth=0.8)
    right.set(xlabel="token load per step", ylabel="measured − fitted (ms)", title="residuals")
    figure.suptitle(title)
    figure.savefig(path)


def fit_residual(observation: Observation, fit: BatchTimeFit) -> float:
    """Measured minus fitted mean step time of one observation, in seconds."""
    hinge = sum(n * max(0.0, b - fit.b0_tokens) for b, n in observation.loads)
    predicted = (
        fit.constant_s
        + fit.a_s_per_token * hinge / observation.steps
        + fit.attention_s_per_token * observation.mean_context_tokens
    )
    return observation.mean_step_s - predicted
