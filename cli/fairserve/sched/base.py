"""What local policies (``sched.local.base``) and dispatchers (``sched.dispatch.base``)
share: a name, typed parameters, a cost model, client weights and the quantum interface.

Why one class: the two families are configured alike (``--param``, live weights, live
quanta) and hosts treat them alike there; two copies of this code had started to differ
in their messages.
"""

from __future__ import annotations

import typing
from abc import ABC
from collections.abc import Mapping
from typing import Any, ClassVar

from fairserve.core.cost import CostModel, WeightedTokenCost
from fairserve.core.errors import ConfigError
from fairserve.core.types import validate_weight
from fairserve.sched.params import W_E, W_Q, Param, Params

MAX_CLIENTS = 10_000
"""Clients whose per-client state a scheduler keeps at once (the router's accounting,
DoubleQ's counters, every local policy's counters): names come from requests, so past it
the least recently seen idle clients are forgotten, each family by a rule that says what
forgetting may change."""


class Scheduler(ABC):
    """A named local policy or dispatcher with its parameters, cost model and weights.

    A subclass declares its parameters by annotating :attr:`config` with its
    :class:`~fairserve.sched.params.Params` dataclass (``config: DLPMParams``): that one
    annotation types ``self.config`` for mypy and, read here when the class is created,
    gives :attr:`params` (``fairserve policies``, ``--param``, docs) and the validation of
    the constructor's keyword arguments."""

    kind: ClassVar[str]
    """How messages name the family ("policy", "dispatcher")."""
    name: ClassVar[str]
    description: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()
    """The declared parameters, read from the fields of :attr:`config_type`."""
    config_type: ClassVar[type[Params]] = Params
    """The class :attr:`config` is annotated with."""
    config: Params
    """The parameters, validated and typed (a frozen dataclass: a live change, such as a
    new quantum, replaces it)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "params" in vars(cls):
            raise TypeError(
                f"{cls.__qualname__}: declare parameters as the fields of the Params class"
                " that its `config` annotation names, not in `params`"
            )
        config_type = typing.get_type_hints(cls).get("config", Params)
        if not (isinstance(config_type, type) and issubclass(config_type, Params)):
            raise TypeError(f"{cls.__qualname__}.config: expected a Params subclass")
        cls.config_type = config_type
        cls.params = config_type.declared()

    def __init__(
        self,
        *,
        cost: CostModel | None,
        weights: Mapping[str, float] | None,
        params: Mapping[str, Any],
    ) -> None:
        self.config = self.config_type.resolve(f"{self.kind} {self.name}", params)
        self.cost: CostModel = cost or WeightedTokenCost(
            w_e=getattr(self.config, W_E.name, W_E.default),
            w_q=getattr(self.config, W_Q.name, W_Q.default),
        )
        """The given cost model, else token weights from the parameters ``w_e``/``w_q``
        where declared (their defaults otherwise)."""
        self.weights: dict[str, float] = {}
        for client, weight in (weights or {}).items():
            self.set_weight(client, weight)

    # ------------------------------------------------------------ configuration
    def weight(self, client: str) -> float:
        return self.weights.get(client, 1.0)

    def set_weight(self, client: str, weight: float) -> None:
        """Change a client's weight live; zero or negative weights are refused."""
        validate_weight(client, weight)
        self.weights[client] = float(weight)

    @property
    def quantum(self) -> float | None:
        """The quantum (a policy's Q^u, a dispatcher's Q^w), or None without one."""
        return None

    def set_quantum(self, quantum: float) -> None:
        """Set the quantum live; takes effect at the next decision."""
        raise ConfigError(f"{self.kind} {self.name} has no quantum")
