"""Batch-time profiles: what one GPU running one model costs per step (DESIGN §6).

A profile is a small TOML file with the piecewise-linear batch-time coefficients of a worker
(``t = overhead + c + a·max(0, b − b0) + attention·context``), its KV capacity and token
budget, and where the numbers came from. The simulator prices every step with one; the
``profile`` command writes one from a live worker. Every number carries its provenance
because a simulated throughput is only as credible as the profile behind it.

Files are validated strictly: unknown keys are errors (a typo must not silently fall back to
a default), and every message names the file, the field and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Literal

from fairserve.core.cost import PiecewiseLinearBatchTime
from fairserve.core.defaults import DEFAULT_BATCHING
from fairserve.core.defaults import DEFAULT_PROFILE as DEFAULT_PROFILE
from fairserve.core.errors import ConfigError, UnknownNameError
from fairserve.sim.engine_types import EngineConfig

SOURCES = ("measured", "simulated", "derived-from-published-data", "synthetic")
"""``simulated``: measured by ``fairserve profile`` against a simulated worker (its numbers
are the simulator's, not a GPU's)."""
FIT_TIMINGS = ("engine", "client")
"""How measured step times were taken (``fairserve profile``): the worker's own step
counters, or client-side timing (server latency and streamed token arrivals)."""
PROFILES_ENV = "FAIRSERVE_PROFILES_DIR"
REPO_PROFILES_DIR = Path(__file__).resolve().parents[3] / "profiles"

Kind = Literal["str", "int", "float"]
# Range a number must fall in: (low, high, low is exclusive).
_NON_NEGATIVE = (0.0, math.inf, False)
_POSITIVE = (0.0, math.inf, True)
_UNIT = (0.0, 1.0, False)


@dataclass(frozen=True, slots=True)
class _Field:
    """One TOML key: where it lives, which ``Profile`` attribute holds it, what it accepts."""

    table: str
    key: str
    attr: str
    kind: Kind
    required: bool = True
    bounds: tuple[float, float, bool] = _NON_NEGATIVE

    @property
    def dotted(self) -> str:
        return f"{self.table}.{self.key}"


_FIELDS = (
    _Field("profile", "gpu", "gpu", "str"),
    _Field("profile", "model", "model", "str"),
    _Field("profile", "engine", "engine", "str"),
    _Field("profile", "engine_version", "engine_version", "str", required=False),
    _Field("profile", "driver_version", "driver_version", "str", required=False),
    _Field("profile", "date", "date", "str"),
    _Field("profile", "source", "source", "str"),
    _Field("profile", "provenance", "provenance", "str"),
    _Field("profile", "tensor_parallel", "tensor_parallel", "int", False, (1.0, math.inf, False)),
    _Field("batch_time", "c_s", "c_s", "float"),
    _Field("batch_time", "a_s_per_token", "a_s_per_token", "float"),
    _Field("batch_time", "b0_tokens", "b0_tokens", "int"),
    _Field("batch_time", "attention_s_per_token", "attention_s_per_token", "float"),
    _Field("batch_time", "step_overhead_s", "step_overhead_s", "float"),
    _Field("capacity", "kv_capacity_tokens", "kv_capacity_tokens", "int", bounds=_POSITIVE),
    _Field("capacity", "max_batch_tokens", "max_batch_tokens", "int", bounds=_POSITIVE),
    _Field("capacity", "max_running_requests", "max_running_requests", "int", False, _POSITIVE),
    _Field("fit", "r2", "fit_r2", "float", bounds=_UNIT),
    _Field("fit", "points", "fit_points", "int"),
    _Field("fit", "timing", "fit_timing", "str", required=False),
    _Field("fit", "rms_residual_s", "fit_rms_residual_s", "float", required=False),
    _Field("energy", "joules_per_token", "joules_per_token", "float", False, _POSITIVE),
    _Field("energy", "mean_power_w", "mean_power_w", "float", False, _POSITIVE),
)
_TABLES = ("profile", "batch_time", "capacity", "fit", "energy")
# [fit] is absent for synthetic profiles (nothing was fitted) and [energy] where unmeasured.
_OPTIONAL_TABLES = ("fit", "energy")


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """One worker's batch-time model and capacity, with where the numbers came from."""

    name: str
    gpu: str
    model: str
    engine: str
    date: str
    source: str
    provenance: str
    c_s: float
    a_s_per_token: float
    b0_tokens: int
    attention_s_per_token: float
    step_overhead_s: float
    kv_capacity_tokens: int
    max_batch_tokens: int
    tensor_parallel: int = 1
    engine_version: str | None = None
    driver_version: str | None = None
    max_running_requests: int | None = None
    fit_r2: float | None = None
    fit_points: int | None = None
    fit_timing: str | None = None
    fit_rms_residual_s: float | None = None
    joules_per_token: float | None = None
    mean_power_w: float | None = None
    # Where it was read from; not part of the profile's value (a copy elsewhere is equal).
    path: Path | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        _validate(self, _label(self.name, self.path))

    def batch_time(self) -> PiecewiseLinearBatchTime:
        """The step-time model the simulator and the time cost use."""
        return PiecewiseLinearBatchTime(
            c_s=self.c_s,
            a_s_per_token=self.a_s_per_token,
            b0_tokens=self.b0_tokens,
            attention_s_per_token=self.attention_s_per_token,
            step_overhead_s=self.step_overhead_s,
        )

    def engine_config(
        self,
        batching: str = DEFAULT_BATCHING,
        kv_capacity_tokens: int | None = None,
        max_running_requests: int | None = None,
    ) -> EngineConfig:
        """The engine this profile describes (KV pool, token budget, running-batch bound),
        with the given batching discipline; ``None`` overrides keep the profile's values."""
        return EngineConfig(
            kv_capacity_tokens=kv_capacity_tokens or self.kv_capacity_tokens,
            max_batch_tokens=self.max_batch_tokens,
            max_running_requests=max_running_requests or self.max_running_requests,
            batching=batching,
        )

    @property
    def capacity_tokens_per_s(self) -> float:
        """Tokens per second with every step at the full budget and no context (DESIGN §1)."""
        return self.batch_time().capacity_tokens_per_s(self.max_batch_tokens)


def load_profile(path: str | Path) -> Profile:
    """Read and validate one profile file; its name is the file stem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: profile file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read profile: {exc}") from None
    return profile_from_toml(text, name=path.stem, path=path)


def profile_from_toml(text: str, name: str, path: Path | None = None) -> Profile:
    """Parse and validate profile TOML; messages name ``path`` (or the profile's name)."""
    label = _label(name, path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{label}: invalid TOML: {exc}") from None
    return Profile(name=name, path=path, **_parse(data, label))


def user_profiles_dir() -> Path:
    """``$XDG_DATA_HOME/fairserve/profiles`` (``~/.local/share/fairserve/profiles`` when the
    variable is unset or not absolute, as the XDG spec says): where ``fairserve profile``
    writes, never into the source checkout."""
    base = os.environ.get("XDG_DATA_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "share"
    return root / "fairserve" / "profiles"


def profile_dirs() -> list[Path]:
    """Where profiles are looked up by name: ``$FAIRSERVE_PROFILES_DIR`` entries, the user's
    data directory (:func:`user_profiles_dir`, so a written profile is found by name), then
    the repository's ``profiles/``. Earlier directories shadow later ones."""
    entries = os.environ.get(PROFILES_ENV, "").split(os.pathsep)
    listed = [Path(entry) for entry in entries if entry]
    return [*listed, user_profiles_dir(), REPO_PROFILES_DIR]


def find_profiles() -> dict[str, Path]:
    """Profile names on the search path and the file each resolves to."""
    found: dict[str, Path] = {}
    for directory in profile_dirs():
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                found.setdefault(path.stem, path)
    return dict(sorted(found.items()))


def shipped_profiles() -> list[Profile]:
    """The profiles in the repository's ``profiles/``, by name."""
    return [load_profile(path) for path in sorted(REPO_PROFILES_DIR.glob("*.toml"))]


def resolve_profile(name_or_path: str | Path) -> Profile:
    """A profile by file path (if it exists or ends in ``.toml``) or by name."""
    candidate = Path(name_or_path)
    if isinstance(name_or_path, Path) or candidate.suffix == ".toml" or candidate.exists():
        return load_profile(candidate)
    known = find_profiles()
    if str(name_or_path) not in known:
        raise UnknownNameError("profile", str(name_or_path), list(known))
    return load_profile(known[str(name_or_path)])


def profile_to_toml(profile: Profile) -> str:
    """The profile as TOML in the layout ``load_profile`` reads (round-trips exactly)."""
    lines: list[str] = []
    for table in _TABLES:
        rows = [
            f"{field.key} = {_toml_value(getattr(profile, field.attr))}"
            for field in _FIELDS
            if field.table == table and getattr(profile, field.attr) is not None
        ]
        if rows:
            lines += ([""] if lines else []) + [f"[{table}]", *rows]
    return "\n".join(lines) + "\n"


def write_profile(profile: Profile, path: str | Path) -> Path:
    """Write ``profile`` to ``path`` (directories created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile_to_toml(profile), encoding="utf-8")
    return path


def _label(name: str, path: Path | None) -> str:
    """How messages name a profile: its file, else its name."""
    return str(path) if path is not None else f"profile {name!r}"


def _parse(data: dict[str, Any], label: str) -> dict[str, Any]:
    """Constructor arguments from parsed TOML: structure and types (ranges: ``_validate``)."""
    for table in data:
        if table not in _TABLES:
            raise ConfigError(f"{label}: unknown table [{table}]{_suggest(table, _TABLES)}")
    values: dict[str, Any] = {}
    for table in _TABLES:
        section = data.get(table)
        if section is None:
            if table not in _OPTIONAL_TABLES:
                raise ConfigError(f"{label}: missing table [{table}]")
            continue
        if not isinstance(section, dict):
            raise ConfigError(f"{label}: {table}: expected a table, got {section!r}")
        fields = {field.key: field for field in _FIELDS if field.table == table}
        for key in section:
            if key not in fields:
                hint = _suggest(key, list(fields))
                raise ConfigError(f"{label}: unknown key {table}.{key}{hint}")
        for key, field in fields.items():
            if key in section:
                values[field.attr] = _coerce(section[key], field)
            elif field.required:
                raise ConfigError(f"{label}: missing field {field.dotted}")
    return values


def _coerce(value: object, field: _Field) -> object:
    """TOML's own types to the profile's: dates to ISO text, integers to floats where a
    number is expected. Anything else is left for ``_validate`` to reject with the field."""
    if field.attr == "date" and isinstance(value, date):
        return value.isoformat()  # an unquoted TOML date
    if field.kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _validate(profile: Profile, label: str) -> None:
    """Ranges and enumerations, for loaded and constructed profiles alike."""
    for field in _FIELDS:
        value = getattr(profile, field.attr)
        if value is not None:
            _check_value(value, field, label)
    if profile.source not in SOURCES:
        raise ConfigError(
            f"{label}: profile.source: expected one of {', '.join(SOURCES)}, got {profile.source!r}"
        )
    try:
        date.fromisoformat(profile.date)
    except ValueError:
        raise ConfigError(
            f"{label}: profile.date: expected a date YYYY-MM-DD, got {profile.date!r}"
        ) from None
    if (profile.fit_r2 is None) != (profile.fit_points is None):
        raise ConfigError(f"{label}: fit: expected both r2 and points, or no [fit] table")
    extras = (profile.fit_timing, profile.fit_rms_residual_s)
    if profile.fit_r2 is None and any(value is not None for value in extras):
        raise ConfigError(f"{label}: fit: timing and rms_residual_s need r2 and points too")
    if profile.fit_timing is not None and profile.fit_timing not in FIT_TIMINGS:
        raise ConfigError(
            f"{label}: fit.timing: expected one of {', '.join(FIT_TIMINGS)}, "
            f"got {profile.fit_timing!r}"
        )
    if profile.c_s + profile.step_overhead_s <= 0:
        raise ConfigError(
            f"{label}: batch_time.c_s: expected c_s + step_overhead_s > 0 "
            "(a step cannot take no time)"
        )


def _check_value(value: object, field: _Field, label: str) -> None:
    where = f"{label}: {field.dotted}"
    if field.kind == "str":
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if field.kind == "int" and not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    low, high, exclusive = field.bounds
    too_low = value <= low if exclusive else value < low
    if not math.isfinite(value) or too_low or value > high:
        raise ConfigError(f"{where}: expected {_describe(field)}, got {value!r}")


def _describe(field: _Field) -> str:
    """``a number >= 0``, ``an integer > 0``, ``a number between 0 and 1``."""
    low, high, exclusive = field.bounds
    kind = "an integer" if field.kind == "int" else "a finite number"
    if high < math.inf:
        return f"{kind} between {low:g} and {high:g}"
    return f"{kind} {'>' if exclusive else '>='} {low:g}"


def _suggest(word: str, choices: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    expected = f"; expected one of: {', '.join(choices)}"
    return f" (did you mean {close[0]!r}?){expected}" if close else expected


def _toml_value(value: object) -> str:
    if isinstance(value, int | float):
        return repr(value)
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    """A TOML basic string that reads back as exactly ``text`` (multi-line if it has lines)."""
    multiline = "\n" in text
    escaped = []
    for char in text:
        if char in '\\"':
            escaped.append("\\" + char)
        elif char in "\n\t" or (char >= " " and char != "\x7f"):
            escaped.append(char)
        else:
            escaped.append(f"\\u{ord(char):04x}")
    body = "".join(escaped)
    if not multiline:
        return f'"{body}"'
    # A line-ending backslash trims the newline before the closing quotes.
    return f'"""\n{body}"""' if body.endswith("\n") else f'"""\n{body}\\\n"""'
