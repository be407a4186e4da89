"""``fairserve top``: the live Textual dashboard of a fair router.

Only :mod:`fairserve.commands.top` imports this package (it loads Textual and aiohttp).
Data flows one way: a :class:`~fairserve.tui.source.StateSource` fetches the router's
``/fairserve/v1/state`` (plus each worker's own state and local GPU readings), the
:mod:`~fairserve.tui.model` parses it into frozen snapshots, :mod:`~fairserve.tui.history`
adds rates over time, and the widgets render those immutable frames. Tests swap the source.
"""
