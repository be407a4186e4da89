"""EXAMPLES and FILES for the man pages: what an operator types first, and where things live.

Options and arguments come from the CLI itself; these two sections are the part a man page
reader looks for that the CLI model cannot tell. Every example is checked by
``tests/cli/test_docgen.py`` to name only options its command has (the example with
``--help`` appended must parse), so an example cannot outlive a renamed option.
"""

from __future__ import annotations

from fairserve.commands.docgen.man import Section

RUN_FILE = (
    "$XDG_RUNTIME_DIR/fairserve/run.json",
    "What launch --detach started (router URL, admin token, workers, pids), mode 0600; "
    "in $XDG_STATE_HOME/fairserve (default ~/.local/state/fairserve) without a runtime "
    "directory. status, stop, top and tune read it.",
)
SETTINGS_FILE = (
    "$XDG_RUNTIME_DIR/fairserve/settings.json",
    "Weights and quanta changed live, beside the run file (mode 0600); a launched router "
    "restores them at start.",
)
LOGS = (
    "$XDG_STATE_HOME/fairserve/runs/TIME-PID/",
    "One launch's logs: the supervisor, the router and one file per worker.",
)
PROFILES = (
    "$XDG_DATA_HOME/fairserve/profiles/",
    "Profiles written by fairserve profile (default ~/.local/share/fairserve/profiles); "
    "searched by name after $FAIRSERVE_PROFILES_DIR and the shipped profiles.",
)
CLIENTS = (
    "clients.toml",
    "A clients file: [[clients]] name, api_key (or api_keys), weight. With one, requests "
    "need an API key.",
)

EXAMPLES: dict[str, tuple[tuple[str, str], ...]] = {
    "fairserve launch": (
        ("fairserve launch --detach", "Two simulated workers and the router on 127.0.0.1:8000."),
        (
            "fairserve launch --clients clients.toml --policy dlpm --quantum 1024 --detach",
            "Keys required; DLPM with Q^u = 1024 inside each worker.",
        ),
        (
            "fairserve launch --engine sglang --model /models/llama --tp 2 --dry-run",
            "Print the SGLang commands and environment, start nothing.",
        ),
    ),
    "fairserve status": (("fairserve status --json", "What runs, as one JSON object."),),
    "fairserve stop": (("fairserve stop --timeout 30", "Stop what launch --detach started."),),
    "fairserve top": (("fairserve top --window 120", "Fairness over the last two minutes."),),
    "fairserve simulate": (
        ("fairserve simulate --list-workloads", "The built-in workloads."),
        (
            "fairserve simulate -w long-qa-s1 --workers 4 --compare dlpm/doubleq,lpm/cache-aware",
            "Two policy/dispatch pairs side by side.",
        ),
        ("fairserve simulate -w vtc-constant --policy vtc --json", "One DESIGN §7 report."),
    ),
    "fairserve worker": (
        (
            "fairserve worker --port 30001 --policy dlpm --speed 10",
            "A simulated worker behind SGLang's HTTP API, ten times faster than real time.",
        ),
    ),
    "fairserve router": (
        (
            "fairserve router --worker-url http://127.0.0.1:30000 --worker-url "
            "http://127.0.0.1:30001 --clients clients.toml --settings settings.json",
            "Front two workers started elsewhere; keep live changes across restarts.",
        ),
    ),
    "fairserve bench": (
        (
            "fairserve bench -w vtc-constant --duration 20 --timeout 60",
            "The workload's clients against the launched router, with their identities.",
        ),
    ),
    "fairserve tune": (("fairserve tune quantum", "The quanta and the bounds they imply."),),
    "fairserve tune quantum": (
        ("fairserve tune quantum 2048", "Set Q^u live on the router and its workers."),
        ("fairserve tune quantum --auto --target-jain 0.95", "Raise Q^u while fairness holds."),
        (
            "fairserve tune quantum --sweep --workload long-qa-s1 --grid 256,1024,4096",
            "Replay in the simulator per quantum; a Pareto front and a recommendation.",
        ),
    ),
    "fairserve tune weight": (("fairserve tune weight team-a 2", "Give team-a twice the share."),),
    "fairserve profile": (
        (
            "fairserve profile --url http://127.0.0.1:30000 --quick",
            "Measure a worker's batch-time coefficients.",
        ),
    ),
    "fairserve profile show": (
        (
            "fairserve profile show a100-llama-3-8b -w vtc-constant",
            "A profile's capacity and the stability bound for a workload.",
        ),
    ),
    "fairserve policies": (("fairserve policies --json", "Every policy and its parameters."),),
}
"""Command line → (example, what it does)."""

FILES: dict[str, tuple[tuple[str, str], ...]] = {
    "fairserve launch": (RUN_FILE, SETTINGS_FILE, LOGS, CLIENTS, PROFILES),
    "fairserve status": (RUN_FILE, SETTINGS_FILE),
    "fairserve stop": (RUN_FILE,),
    "fairserve top": (RUN_FILE,),
    "fairserve tune": (RUN_FILE, SETTINGS_FILE),
    "fairserve tune quantum": (RUN_FILE, SETTINGS_FILE),
    "fairserve tune weight": (RUN_FILE, SETTINGS_FILE),
    "fairserve router": (CLIENTS,),
    "fairserve worker": (PROFILES,),
    "fairserve simulate": (PROFILES,),
    "fairserve profile": (PROFILES,),
    "fairserve profile show": (PROFILES,),
}
"""Command line → (path, what it holds)."""


def sections(command_line: str) -> tuple[Section, ...]:
    """The EXAMPLES and FILES sections of one command's page (none it has no entry in)."""
    out: list[Section] = []
    examples = EXAMPLES.get(command_line, ())
    if examples:
        out.append(Section("Examples", "", tuple((cmd, (what,)) for cmd, what in examples)))
    files = FILES.get(command_line, ())
    if files:
        out.append(Section("Files", "", tuple((path, (what,)) for path, what in files)))
    return tuple(out)
