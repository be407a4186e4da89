"""fairserve: run a shared LLM service fairly.

The package is layered (DESIGN §3): ``core`` (pure types, costs, radix tree, metrics) is
imported by ``sched`` (policies and dispatchers), which every host (simulator, router,
SGLang plugin) reuses unchanged.
"""

__version__ = "0.1.0"
