"""fairserve inside SGLang: the scheduler plugin and its worker extension.

Importing this package never imports SGLang; only :func:`fairserve.sglang.plugin.register`
and one hook do, when SGLang itself runs them. The launcher (``fairserve launch --engine
sglang``) reads :mod:`fairserve.sglang.config` and :mod:`fairserve.sglang.targets` only.
"""
