"""Pure scheduling primitives: request types, cost functions, the token radix tree and
fairness metrics. Standard library only (numpy allowed), no I/O, so every host can reuse it."""
