"""Register the experiments' verdict rules before their full runs: ``python scripts/register_rules.py [NAME ...]``.

Writes each named experiment's ``rule()`` (all experiments without names) into
src/attnlab/experiments/rules.json where it differs from the registered one, with ``fixed_at: null``: the rule
is then fixed in the commit that registers it (found again from git by its digest, ``provenance.rule_commit``).
Commit the registry, then run. ``--check`` lists the experiments whose code rule is not registered and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys

from attnlab.experiments import EXPERIMENTS, load
from attnlab.experiments.provenance import REGISTRY, digest, registered


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="experiments to register (default: all)")
    p.add_argument("--check", action="store_true", help="only list the unregistered rules")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in EXPERIMENTS]
    if unknown:
        print(f"register_rules: unknown experiment {unknown[0]!r}; one of {', '.join(EXPERIMENTS)}", file=sys.stderr)
        return 2
    registry = registered()
    changed = []
    for name in args.names or list(EXPERIMENTS):
        rule = list(load(name).rule())
        if registry.get(name, {}).get("rule") != rule:
            changed.append(name)
            registry[name] = {"rule": rule, "sha256": digest(rule), "fixed_at": None}
    if args.check:
        print("\n".join(f"not registered: {n}" for n in changed) or "every rule is registered")
        return 1 if changed else 0
    REGISTRY.write_text(json.dumps(dict(sorted(registry.items())), indent=2) + "\n")
    print(f"registered {', '.join(changed) or 'nothing new'}; commit {REGISTRY} before the full runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
