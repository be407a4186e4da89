"""A table of classes by name, the one mechanism behind both families (local policies in
``sched.local.base``, dispatchers in ``sched.dispatch.base``): a class decorator that adds a
class under its ``name``, refusing a name twice, and a lookup whose error lists the choices.
``sched.registry`` builds the families' canonical order and descriptions on top of it."""

from __future__ import annotations

from typing import ClassVar, Generic, Protocol, TypeVar

from fairserve.core.errors import ConfigError, UnknownNameError


class Named(Protocol):
    name: ClassVar[str]


C = TypeVar("C", bound=type[Named])


class NamedClasses(Generic[C]):
    """Classes registered by their ``name``, in registration order."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        """How messages name a member ("local policy", "dispatcher")."""
        self._classes: dict[str, C] = {}

    def register(self, cls: C) -> C:
        """Class decorator: make ``cls`` available by its ``name``."""
        if cls.name in self._classes:
            raise ConfigError(f"{self.kind} {cls.name!r} registered twice")
        self._classes[cls.name] = cls
        return cls

    def lookup(self, name: str) -> C:
        try:
            return self._classes[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, list(self._classes)) from None

    def names(self) -> list[str]:
        return list(self._classes)
