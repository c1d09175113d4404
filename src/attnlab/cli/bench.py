"""``attnlab bench``: run a benchmark script of the checkout's ``benchmarks/`` (a table and JSON)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.cli.errors import unknown_name


def register(sub: argparse._SubParsersAction) -> None:
    """Add the bench command to the parser."""
    p = sub.add_parser("bench", help="run a benchmark from benchmarks/ (prints a table, writes JSON)")
    p.add_argument("name", nargs="?", help="e.g. train_throughput, attention, generation_cache")
    p.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark, e.g. --quick")
    p.add_argument("--list", action="store_true", help="list the benchmarks (with a name: that one's line)")
    p.set_defaults(func=_cmd_bench)


def _benchmarks_dir() -> Path:
    """benchmarks/ of the checkout: the current folder's, else the one beside the installed sources."""
    import attnlab

    for root in (Path.cwd(), Path(attnlab.__file__).resolve().parents[2]):
        if (root / "benchmarks").is_dir():
            return root / "benchmarks"
    from attnlab.core.errors import ConfigError

    raise ConfigError("no benchmarks/ folder found: run attnlab bench from the attnlab checkout")

def _cmd_bench(args: argparse.Namespace) -> int:
    import ast
    import subprocess

    if args.name is not None and not args.name.strip():  # an unset shell variable: not a request for the list
        from attnlab.core.errors import ConfigError

        raise ConfigError("the benchmark name is empty (an unset shell variable?); see attnlab bench --list")
    folder = _benchmarks_dir()
    scripts = {p.stem: p for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")}
    if args.name and args.name not in scripts:
        raise unknown_name("benchmark", args.name, list(scripts))
    if args.list or not args.name:
        if args.args:  # arguments for a run that --list would silently drop
            from attnlab.core.errors import ConfigError

            raise ConfigError(f"--list only lists; {' '.join(args.args)} would be passed to a run: "
                              "leave out --list to run the benchmark")
        for name in [args.name] if args.name else scripts:
            doc = ast.get_docstring(ast.parse(scripts[name].read_text(encoding="utf-8"))) or ""
            print(f"{name:<20} {doc.splitlines()[0] if doc else ''}")
        return 0
    return subprocess.call([sys.executable, str(scripts[args.name]), *args.args])
