"""Scheduling policies: local policies (one engine's admissions) and global dispatchers
(which worker gets a request). Pure code reused unchanged by the simulator, the router and
the SGLang plugin. Import :mod:`fairserve.sched.registry` to get every registered name."""
