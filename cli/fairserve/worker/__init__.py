"""The simulated GPU worker: a sim engine driven in real time behind an SGLang-compatible
HTTP API (DESIGN §5), so routers, benchmarks and dashboards run without a GPU.

``config`` (what to run) → ``runtime`` (engine + wall-clock driver loop) → ``server``
(aiohttp app: ``generation`` and ``admin`` handlers, ``metrics``). ``tokenizer`` and ``api``
turn request bodies into token ids; ``responses`` writes SGLang and OpenAI shapes.
"""
