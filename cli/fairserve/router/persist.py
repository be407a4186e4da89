"""Fairness settings changed live (weights, Q^u, Q^w) survive a router restart.

An operator who ran ``fairserve tune weight team-a 3`` expects team-a to keep weight 3
after the router restarts; before this, the router came back with the clients file's
weights while the workers still enforced 3 (split brain). So every live change is written
to a settings file (JSON, atomically: a temporary file in the same directory, fsync, then
``os.replace``; mode 0600 like the run file) and read back at start.

Precedence at start: a weight changed live wins over the clients file (it was set later);
a quantum from the command line wins over a saved one (the operator just asked for it).
A file that cannot be read or parsed is set aside as ``<name>.broken`` with a warning, and
the router starts from its command line: a corrupt file must not keep the service down.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fairserve.core.errors import ConfigError

log = logging.getLogger("fairserve.router")

VERSION = 1


@dataclass(slots=True)
class LiveSettings:
    """What was changed through the admin API, and when it was last saved."""

    weights: dict[str, float] = field(default_factory=dict)
    quantum: float | None = None
    worker_quantum: float | None = None
    saved_at: float | None = None
    """Unix time of the last save (None: never saved)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "saved_at": self.saved_at,
            "weights": dict(sorted(self.weights.items())),
            "quantum": _finite_or_text(self.quantum),
            "worker_quantum": _finite_or_text(self.worker_quantum),
        }


class Settings(Protocol):
    """What the file saves and restores: ``router.settings.FairnessSettings``, which builds
    the :class:`LiveSettings` it saves (so this module does not import it back)."""

    def live(self) -> LiveSettings: ...
    def set_weight(self, client: str, weight: float) -> object: ...
    def set_quantum(self, quantum: float) -> object: ...
    def set_worker_quantum(self, quantum: float) -> object: ...


class SettingsFile:
    """One router's settings file: restored at start, saved after every live change, and
    where they came from for the state and ``status``. No path: nothing is kept."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self.restored_at_start = False
        """Settings were read back from ``path`` at start."""
        self.saved_at: float | None = None
        """Unix time the live settings were last saved (or restored from)."""

    def restore(self, settings: Settings, quantum_given: bool, worker_quantum_given: bool) -> None:
        """Apply what the admin API changed before a restart: saved weights over the
        clients file's; saved quanta where the command line set none (``*_given``)."""
        if self.path is None:
            return
        saved = load(self.path)
        if saved is None:
            return
        self.restored_at_start, self.saved_at = True, saved.saved_at
        for client, weight in saved.weights.items():
            settings.set_weight(client, weight)
        try:
            if not quantum_given and saved.quantum is not None:
                settings.set_quantum(saved.quantum)
            if not worker_quantum_given and saved.worker_quantum is not None:
                settings.set_worker_quantum(saved.worker_quantum)
        except ConfigError as exc:
            log.warning("saved quanta in %s do not apply: %s", self.path, exc)
        log.info("restored live settings from %s", self.path)

    def save(self, settings: Settings) -> None:
        """Write the live settings (atomically); a failure is logged, never fatal."""
        if self.path is None:
            return
        live = settings.live()
        try:
            save(self.path, live)
        except OSError as exc:
            log.warning("could not save the live settings to %s: %s", self.path, exc)
            return
        self.saved_at = live.saved_at

    def view(self) -> dict[str, Any]:
        return {
            "file": None if self.path is None else str(self.path),
            "restored_at_start": self.restored_at_start,
            "saved_at": self.saved_at,
        }


def save(path: Path, settings: LiveSettings) -> None:
    """Write ``settings`` to ``path`` atomically with mode 0600."""
    settings.saved_at = time.time()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = json.dumps(settings.to_json(), indent=1).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path) -> LiveSettings | None:
    """The saved settings, None when there are none (or the file was broken: set aside)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read the saved settings %s: %s; starting without", path, exc)
        return None
    try:
        return parse(json.loads(raw))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        broken = path.with_name(path.name + ".broken")
        os.replace(path, broken)
        log.warning("saved settings %s are broken (%s): moved to %s", path, exc, broken)
        return None


def parse(data: Any) -> LiveSettings:
    """Validate a settings document (raises ``ValueError`` naming the bad field)."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"expected an object with version {VERSION}")
    weights = data.get("weights", {})
    if not isinstance(weights, dict):
        raise ValueError("weights: expected an object")
    checked = {str(name): _positive(f"weights.{name}", w) for name, w in weights.items()}
    saved_at = data.get("saved_at")
    return LiveSettings(
        weights=checked,
        quantum=_quantum("quantum", data.get("quantum")),
        worker_quantum=_quantum("worker_quantum", data.get("worker_quantum")),
        saved_at=float(saved_at) if isinstance(saved_at, int | float) else None,
    )


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: expected a number")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected a positive number")
    return float(value)


def _quantum(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if value == "inf":
        return math.inf
    return _positive(name, value)


def _finite_or_text(value: float | None) -> float | str | None:
    return "inf" if value is not None and math.isinf(value) else value
