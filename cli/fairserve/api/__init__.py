"""The wire contracts shared by fairserve's servers and clients: paths, JSON rules, admin
authentication and the worker extension's handler table.

Standard library only, above ``core`` and ``sched`` and below every host (router,
simulated worker, SGLang plugin): a host adapts its transport to these pure functions, so
routes, shapes and auth answers are written once and cannot drift between hosts.
"""
