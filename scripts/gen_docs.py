#!/usr/bin/env python3
"""Generate man/ and completions/ from the fairserve CLI (see fairserve.commands.docgen).

    python scripts/gen_docs.py           # rewrite the generated files
    python scripts/gen_docs.py --check   # exit 1 and list the files that drifted

Run it after changing a command, an option, a help text or a registered policy, and commit
the result; CI runs ``--check``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if any file drifted"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO, help="tree holding man/ and completions/ (default: repo)"
    )
    args = parser.parse_args(argv)

    # Document this checkout's CLI, even when another copy of fairserve is installed.
    sys.path.insert(0, str(REPO / "cli"))
    from fairserve.commands.docgen import drift, generate, write

    files = generate()
    if args.check:
        drifted = drift(args.out, files)
        for path in drifted:
            print(f"drifted: {path}", file=sys.stderr)
        if drifted:
            print("run: python scripts/gen_docs.py", file=sys.stderr)
            return 1
        return 0
    for path in write(args.out, files):
        print(f"wrote {path}" if path in files else f"removed {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
