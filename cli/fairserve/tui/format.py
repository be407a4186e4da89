"""Short, fixed-width renderings of numbers for a terminal that may be 80 columns wide.

Every function takes ``None`` (unknown, "n/a") and infinities without raising: the
dashboard shows what it knows and says so for the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text

NA = "n/a"
BLOCKS = "▁▂▃▄▅▆▇█"


def si(value: float | None, digits: int = 3) -> str:
    """1234 → ``1.23k``; ``None`` → n/a; inf → ∞."""
    if value is None:
        return NA
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    sign, magnitude = ("-" if value < 0 else ""), abs(value)
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= scale * 0.9995:
            return f"{sign}{_digits(magnitude / scale, digits)}{suffix}"
    return f"{sign}{_digits(magnitude, digits)}"


def _digits(value: float, digits: int) -> str:
    if value >= 100 or value == int(value):
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.{max(0, digits - 2)}f}"
    return f"{value:.{max(0, digits - 1)}f}"


def quantum(value: float | None) -> str:
    """A quantum as set (``512``, ``2048``, ``∞``, ``-`` when the policy has none)."""
    if value is None:
        return "-"
    if math.isinf(value):
        return "∞"
    return f"{value:g}"


def pct(fraction: float | None) -> str:
    if fraction is None or math.isinf(fraction):
        return NA
    return f"{fraction * 100:.0f}%"


def seconds(value: float | None) -> str:
    """A latency: ``850ms``, ``1.2s``, ``3m05s``."""
    if value is None or math.isinf(value):
        return NA
    if value < 1.0:
        return f"{value * 1000:.0f}ms"
    if value < 60.0:
        return f"{value:.1f}s"
    return duration(value)


def duration(value: float) -> str:
    """An uptime: ``42s``, ``3m05s``, ``2h07m``, ``3d04h``."""
    total = int(max(0.0, value))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def pair(first: str, second: str) -> str:
    return f"{first}/{second}"


def deficit_strip(deficits: Sequence[float], full: float | None) -> Text:
    """One character per worker: the block's height is the deficit left out of Q^w, a red
    ``▾`` a negative deficit (the client has overdrawn that worker and must move)."""
    text = Text()
    for value in deficits:
        if value < 0:
            text.append("▾", style="bold red")
            continue
        level = 1.0 if not full or math.isinf(full) else min(1.0, value / full)
        text.append(BLOCKS[round(level * (len(BLOCKS) - 1))], style="green")
    return text


def sparkline(values: Sequence[float | None], top: float, width: int) -> str:
    """The last ``width`` values as block characters scaled to ``top`` (blank = unknown)."""
    return bars(values, top, width, rows=1)[0]


def bars(values: Sequence[float | None], top: float, width: int, rows: int) -> list[str]:
    """The last ``width`` values as a bar chart ``rows`` lines high (top line first), right
    aligned; a known value shows at least the lowest block, an unknown one nothing."""
    shown = list(values)[-width:] if width > 0 else []
    steps = rows * len(BLOCKS)
    lines = []
    for row in range(rows):
        floor = (rows - 1 - row) * len(BLOCKS)  # blocks below this line
        chars = []
        for value in shown:
            if value is None or top <= 0:
                chars.append(" ")
                continue
            level = max(1, round(min(1.0, max(0.0, value / top)) * steps))
            part = min(len(BLOCKS), level - floor)
            chars.append(BLOCKS[part - 1] if part > 0 else " ")
        lines.append("".join(chars).rjust(max(0, width)))
    return lines


def mib(used: float | None, total: float | None) -> str:
    if used is None:
        return NA
    if total:
        return f"{used / 1024:.0f}/{total / 1024:.0f}G"
    return f"{used / 1024:.1f}G"


def watts(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}W"
