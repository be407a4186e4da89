"""The ``?`` screen: keys, and what the less obvious columns mean."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP_TEXT = """\
[b]Keys[/b]
  [b]+[/b] [b]-[/b]   double / halve Q^u, the local quantum (DLPM's deficit refill)
  [b]W[/b] [b]w[/b]   double / halve Q^w, DoubleQ's per-worker quantum: how much a
        client may take from its cached worker before it must move
  [b]p[/b]     pause / resume polling       [b]s[/b]  next sort order of the clients
  [b]?[/b]     this help (esc closes)       [b]q[/b]  quit
  [b]↑ ↓ ← →[/b] move in and scroll the clients table
  Quantum keys need the admin token (the run file's, or --token).

[b]Clients[/b]
  q/run     waiting (router + workers) / running on a worker
  svc/s     service per second: w_e·input + w_q·output tokens
  share     this client's part of all service
  deficit   DoubleQ's deficits over the workers, smallest/largest
  workers   one block per worker (workers table order): the deficit
            left of Q^w; [red]▾[/red] overdrawn: the next request moves away
  lat ttft  p50/p99 latency and time to first token; rej: 429s

[b]Workers[/b]
  run/queue running / waiting requests as the worker reports them
  hit total cached share of the worker's prompt tokens since it started
  KV        share of the KV cache in use; tok/s prompt + output tokens
  GPU       the local GPU it runs on (n/a: none seen by NVML here)

[b]Header[/b]
  Jain      Jain's index of weighted ("wtd": divided by weight) service
            rates over the last window (top --window); each client is
            judged over its own active time in the window (1 = equal)
  cache hit cached share of the prompt tokens over the last polls (as tok/s)
  load      tokens computed per second over the workers' capacity
  gap       largest weighted service gap between continuously backlogged
            clients in the window, in service units ("su": w_e·input +
            w_q·output tokens, divided by the client's weight)
  live      streamed requests count as their tokens arrive, not at the end
"""


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90; max-width: 100%; height: auto; max-height: 100%;
        border: round $accent; background: $surface; padding: 0 1;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "close"),
        Binding("question_mark", "dismiss", "close", show=False),
        Binding("q", "dismiss", "close", show=False),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(HELP_TEXT)
