"""Declared parameters of policies and dispatchers.

Each policy declares its parameters once, as the fields of a frozen dataclass (a
:class:`Params` subclass, see :func:`param`): the fields give the policy a typed parameter
object (``self.config.quantum``, checked by mypy) and, read back as :class:`Param`
declarations, validate constructor arguments (no silent defaults for bad values) and feed
``fairserve policies``, ``--param`` and the CLI help.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self

from fairserve.core.errors import ConfigError

_KIND_WORDS: dict[type, str] = {int: "an integer", float: "a number", bool: "true or false"}


@dataclass(frozen=True, slots=True)
class Param:
    """One tunable parameter: name, type, default, meaning and valid range."""

    name: str
    kind: type
    default: Any
    description: str
    minimum: float | None = None
    exclusive_minimum: bool = False
    allow_inf: bool = False
    choices: tuple[str, ...] = ()
    """For ``kind=str``: the accepted values (a string parameter is always an enumeration)."""

    def validate(self, owner: str, value: Any) -> Any:
        """Return ``value`` converted to the declared type, or raise a ConfigError."""
        label = f"{owner}: parameter {self.name!r}"
        if self.kind is str:
            if value not in self.choices:
                raise ConfigError(
                    f"{label} must be one of: {', '.join(self.choices)}; got {value!r}"
                )
            return value
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{label} must be true or false, got {value!r}")
            return value
        try:
            number = float(value) if self.kind is float else int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{label} must be {_KIND_WORDS[self.kind]}, got {value!r}") from None
        if isinstance(value, bool):
            raise ConfigError(f"{label} must be {_KIND_WORDS[self.kind]}, got {value!r}")
        if self.kind is int and float(value) != number:
            raise ConfigError(f"{label} must be a whole number, got {value!r}")
        if isinstance(number, float) and math.isnan(number):
            raise ConfigError(f"{label} must be a number, got NaN")
        if isinstance(number, float) and math.isinf(number) and not (self.allow_inf and number > 0):
            raise ConfigError(f"{label} must be finite, got {value!r}")
        self._check_minimum(label, number)
        return number

    def parse(self, owner: str, text: str) -> Any:
        """``validate`` for a value written on a command line (``true``, ``4``, ``inf``)."""
        label = f"{owner}: parameter {self.name!r}"
        value: Any = text
        if self.kind is bool:
            words = {"true": True, "false": False}
            if text.strip().lower() not in words:
                raise ConfigError(f"{label} must be true or false, got {text!r}")
            value = words[text.strip().lower()]
        elif self.kind in (int, float):
            try:
                value = int(text) if self.kind is int else float(text)
            except ValueError:
                raise ConfigError(
                    f"{label} must be {_KIND_WORDS[self.kind]}, got {text!r}"
                ) from None
        return self.validate(owner, value)

    def _check_minimum(self, label: str, number: float) -> None:
        if self.minimum is None:
            return
        if self.exclusive_minimum and number <= self.minimum:
            raise ConfigError(f"{label} must be > {self.minimum:g}, got {number:g}")
        if not self.exclusive_minimum and number < self.minimum:
            raise ConfigError(f"{label} must be >= {self.minimum:g}, got {number:g}")

    def field(self) -> Any:
        """This declaration as a field of a :class:`Params` dataclass, for a parameter that
        several policies share (the field's name and annotation must be this one's)."""
        return dataclasses.field(default=self.default, metadata={_DECLARATION: self})

    def describe(self) -> dict[str, Any]:
        """JSON-able description for ``fairserve policies --json``."""
        default = self.default
        if isinstance(default, float) and math.isinf(default):
            default = "inf"
        out: dict[str, Any] = {
            "name": self.name,
            "type": self.kind.__name__,
            "default": default,
            "description": self.description,
        }
        if self.choices:
            out["choices"] = list(self.choices)
        if self.minimum is not None:
            out["minimum"] = self.minimum
            out["exclusive_minimum"] = self.exclusive_minimum
        return out


def resolve_params(
    owner: str, declared: tuple[Param, ...], given: Mapping[str, Any]
) -> dict[str, Any]:
    """Validate ``given`` against ``declared``; unknown names are an error, not ignored."""
    known = {p.name: p for p in declared}
    unknown = sorted(set(given) - set(known))
    if unknown:
        expected = ", ".join(sorted(known)) or "no parameters"
        names = ", ".join(unknown)
        raise ConfigError(f"{owner}: unknown parameter(s) {names}; expected {expected}")
    return {
        name: p.validate(owner, given[name]) if name in given else p.default
        for name, p in known.items()
    }


_DECLARATION = "fairserve.param"
"""The key under which a :class:`Params` field's metadata holds its declaration."""


@dataclass(frozen=True, slots=True)
class _Limits:
    """What :func:`param` records of a field: the rest of a :class:`Param` comes from the
    field itself (name, annotation, default)."""

    description: str
    minimum: float | None
    exclusive_minimum: bool
    allow_inf: bool


def param(
    default: Any,
    description: str,
    *,
    minimum: float | None = None,
    exclusive_minimum: bool = False,
    allow_inf: bool = False,
) -> Any:
    """Declare a parameter as a field of a :class:`Params` dataclass: the field's name is
    the parameter's name and its annotation the type (``int``, ``float``, ``bool``, or a
    ``Literal`` of strings, whose values are the choices)."""
    limits = _Limits(description, minimum, exclusive_minimum, allow_inf)
    return dataclasses.field(default=default, metadata={_DECLARATION: limits})


@dataclass(frozen=True, slots=True)
class Params:
    """Base of every policy's and dispatcher's typed parameters: a frozen dataclass whose
    fields, declared with :func:`param` or :meth:`Param.field`, are the declarations. This
    base declares none (policies without parameters use it as it is)."""

    @classmethod
    def declared(cls) -> tuple[Param, ...]:
        """The fields as :class:`Param` declarations, in field order."""
        return _declarations(cls)

    @classmethod
    def resolve(cls, owner: str, given: Mapping[str, Any]) -> Self:
        """The parameters ``given`` by name, validated, the others at their defaults;
        unknown names are an error (``owner`` starts the messages)."""
        return cls(**resolve_params(owner, cls.declared(), given))

    def as_dict(self) -> dict[str, Any]:
        """``{name: value}`` in declaration order (snapshots, JSON)."""
        return {p.name: getattr(self, p.name) for p in self.declared()}


_DECLARED: dict[type[Params], tuple[Param, ...]] = {}
"""Each class's declarations, read once (reading resolves its annotations)."""


def _declarations(cls: type[Params]) -> tuple[Param, ...]:
    declared = _DECLARED.get(cls)
    if declared is None:
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        declared = _DECLARED[cls] = tuple(_declaration(cls, f, hints[f.name]) for f in fields)
    return declared


def _declaration(cls: type, field: dataclasses.Field[Any], annotation: Any) -> Param:
    """A field read back as its :class:`Param`; a shared declaration must agree with the
    field it stands in (name, type, choices), so that the two cannot drift apart."""
    where = f"{cls.__qualname__}.{field.name}"
    if typing.get_origin(annotation) is Literal:
        kind: type = str
        choices = tuple(str(c) for c in typing.get_args(annotation))
    elif annotation in (int, float, bool):
        kind, choices = annotation, ()
    else:
        raise TypeError(f"{where}: a parameter is an int, float, bool or Literal of strings")
    spec = field.metadata.get(_DECLARATION)
    if isinstance(spec, Param):
        if (spec.name, spec.kind, spec.choices) != (field.name, kind, choices):
            raise TypeError(f"{where}: declared as {spec.name!r} of type {spec.kind.__name__}")
        return spec
    if not isinstance(spec, _Limits):
        raise TypeError(f"{where}: declare it with param(...) or a shared Param's .field()")
    return Param(
        field.name,
        kind,
        field.default,
        spec.description,
        minimum=spec.minimum,
        exclusive_minimum=spec.exclusive_minimum,
        allow_inf=spec.allow_inf,
        choices=choices,
    )


QUANTUM = Param(
    "quantum",
    float,
    512.0,
    "deficit quantum Q^u added to a client's counter per round (service units)",
    minimum=0.0,
    exclusive_minimum=True,
)
W_E = Param("w_e", float, 1.0, "service per extend (uncached prompt) token", minimum=0.0)
W_Q = Param("w_q", float, 2.0, "service per output token", minimum=0.0)
MEMORY_PATIENCE = Param(
    "memory_patience",
    int,
    8,
    "decisions in a row the most entitled client may be bypassed while blocked on memory "
    "before admissions pause until its request fits (0: VTC Algorithm 2's Break)",
    minimum=0,
)
