"""The command line: one Typer module per command, the output sink and the exit-code map.

The only package allowed to import typer and rich at module level (DESIGN §3); nothing else
in fairserve imports it.
"""
