"""Typed readers for workload-file fields that fail with the file, the field path and the
expectation in one message, e.g.
``workload.toml: clients[1].rate_per_s: expected a positive number, got -3``.

TOML booleans are Python ints; every reader rejects them so ``turns = true`` is an error
rather than one turn.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NoReturn

from fairserve.core.errors import ConfigError
from fairserve.workloads.dists import Constant, Dist, LogNormal, Uniform

SANITY_LIMIT = "a larger value is almost certainly a typo"

DIST_KEYS: dict[str, tuple[str, ...]] = {
    "constant": ("dist", "value"),
    "uniform": ("dist", "min", "max"),
    "lognormal": ("dist", "mean", "cv", "min", "max"),
}


@dataclass(frozen=True, slots=True)
class Table:
    """A TOML table being read, with where it sits (``clients[1]``) and which file."""

    data: Mapping[str, object]
    path: str
    source: str

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, expected: str, got: object) -> NoReturn:
        raise ConfigError(f"{self.source}: {self.at(key)}: expected {expected}, got {got!r}")

    def error(self, key: str, message: str) -> NoReturn:
        raise ConfigError(f"{self.source}: {self.at(key)}: {message}")

    def check_keys(self, allowed: Iterable[str]) -> None:
        """Unknown keys are errors: a typo must not silently fall back to a default."""
        known = tuple(allowed)
        for key in self.data:
            if key not in known:
                self.error(key, f"unknown key; expected one of: {', '.join(sorted(known))}")

    def string(self, key: str, default: str | None = None) -> str:
        value = self.data.get(key, default)
        if value is None:
            self.error(key, "missing (expected a string)")
        if not isinstance(value, str) or not value:
            self.fail(key, "a non-empty string", value)
        return value

    def choice(self, key: str, options: tuple[str, ...], default: str | None = None) -> str:
        value = self.data.get(key, default)
        if value is None:
            self.error(key, f"missing (expected one of: {', '.join(options)})")
        if value not in options:
            self.fail(key, f"one of: {', '.join(options)}", value)
        assert isinstance(value, str)
        return value

    def number(
        self, key: str, default: float | None = None, *, minimum: float = 0.0, strict: bool = True
    ) -> float:
        """A finite number > ``minimum`` (``strict``) or >= ``minimum``."""
        value = self.data.get(key, default)
        if value is None:
            self.error(key, "missing (expected a number)")
        relation = ">" if strict else ">="
        expected = f"a number {relation} {_show(minimum)}"
        if minimum == 0 and strict:
            expected = "a positive number"
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(key, expected, value)
        number = float(value)
        if not math.isfinite(number) or number < minimum or (strict and number == minimum):
            self.fail(key, expected, value)
        return number

    def integer(
        self, key: str, default: int | None = None, *, minimum: int = 1, maximum: int | None = None
    ) -> int:
        value = self.data.get(key, default)
        if value is None:
            self.error(key, f"missing (expected an integer >= {minimum})")
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(key, f"an integer >= {minimum}", value)
        if maximum is not None and value > maximum:
            self.fail(key, f"an integer <= {maximum} ({SANITY_LIMIT})", value)
        return value

    def table(self, key: str) -> Table:
        value = self.data.get(key)
        if not isinstance(value, Mapping):
            self.fail(key, "a table", value)
        return Table(value, self.at(key), self.source)

    def dist(
        self,
        key: str,
        default: Dist | None,
        *,
        floor: float,
        integer: bool,
        ceiling: float = math.inf,
    ) -> Dist:
        """A number or ``{ dist = ..., ... }`` with values in ``[floor, ceiling]``.

        ``integer``: token counts (whole numbers); otherwise durations in seconds. A
        lognormal without ``max`` is clamped at ``ceiling``.
        """
        value = self.data.get(key)
        if value is None:
            if default is None:
                self.error(key, "missing (expected a number or a { dist = ... } table)")
            return default
        if isinstance(value, Mapping):
            table = Table(value, self.at(key), self.source)
            return table.dist_table(floor, integer, ceiling)
        return Constant(self._bound(key, value, floor, integer, ceiling))

    def dist_table(self, floor: float, integer: bool, ceiling: float = math.inf) -> Dist:
        kind = self.choice("dist", tuple(DIST_KEYS))
        self.check_keys(DIST_KEYS[kind])
        if kind == "constant":
            return Constant(self._bound("value", self.data.get("value"), floor, integer, ceiling))
        if kind == "uniform":
            low = self._bound("min", self.data.get("min"), floor, integer, ceiling)
            high = self._bound("max", self.data.get("max"), low, integer, ceiling)
            return Uniform(low, high, integer)
        mean = self.number("mean")
        cv = self.number("cv", minimum=0.0, strict=False)
        low = self._bound("min", self.data.get("min", floor), floor, integer, ceiling)
        high = self._bound("max", self.data.get("max", ceiling), low, integer, ceiling)
        return LogNormal(mean, cv, low, high)

    def _bound(self, key: str, value: object, floor: float, integer: bool, ceiling: float) -> float:
        kind = "an integer" if integer else "a number"
        expected = f"{kind} >= {_show(floor)}"
        if value is None:
            self.error(key, f"missing (expected {expected})")
        if value == math.inf and ceiling == math.inf:
            return math.inf
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(key, expected, value)
        if integer and not isinstance(value, int):
            self.fail(key, expected, value)
        if not math.isfinite(value) or value < floor:
            self.fail(key, expected, value)
        if value > ceiling:
            self.fail(key, f"{kind} <= {_show(ceiling)} ({SANITY_LIMIT})", value)
        return float(value)


def _show(number: float) -> str:
    """``1048576`` rather than ``1.04858e+06``; ``0.5`` stays ``0.5``."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"
