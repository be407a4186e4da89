"""The fair router: OpenAI-compatible HTTP front, dispatch, upstream pool and health,
router-side fair queue, accounting, admin API and Prometheus metrics (DESIGN §3, §5).

Import :class:`fairserve.router.server.RouterServer` to run one in-process.
"""
