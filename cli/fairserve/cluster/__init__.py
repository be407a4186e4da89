"""Start and supervise the processes behind ``fairserve launch``; the run file.

``launch`` turns one command into a running fair service: worker subprocesses (simulated
now, SGLang later), the router in front of them, and a run file that ``status``, ``stop``,
``top`` and ``tune`` read to find it all again. Everything here is host-side process
management, so it may use psutil, subprocess and aiohttp; the scheduling layers never do.
"""
