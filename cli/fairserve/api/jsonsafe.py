"""The one rule for floats JSON cannot carry, for every fairserve server.

JSON has neither NaN nor infinities, and ``json.dumps`` would write the non-standard
``NaN``/``Infinity`` tokens that strict parsers refuse. The rule:

* ``+inf`` becomes ``"inf"`` and ``-inf`` ``"-inf"``: an infinite value is meaningful here
  (``worker_quantum = inf`` is the DoubleQ setting that never moves a client; Justitia's
  virtual finish time of an unknown job) and the readers (``tui.parse.as_float``, ``tune``)
  turn the strings back into floats; ``sched.dispatch.doubleq`` writes the same strings;
* NaN becomes ``null``: it is "no value" (an empty percentile, a rate over no time).

Dictionary keys become strings (as ``json.dumps`` would) and tuples become lists.
"""

from __future__ import annotations

import json
import math
from typing import Any

POSITIVE_INFINITY = "inf"
NEGATIVE_INFINITY = "-inf"


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by the rule above."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return POSITIVE_INFINITY if value > 0 else NEGATIVE_INFINITY
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def dumps(payload: Any) -> str:
    """Strict JSON text of ``payload`` under the rule above (never ``NaN``/``Infinity``)."""
    return json.dumps(json_safe(payload), allow_nan=False)
