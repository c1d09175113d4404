"""``attnlab experiment``: run one of the studies in ``attnlab.experiments``."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli.errors import unknown_name


def register(sub: argparse._SubParsersAction) -> None:
    """Add the experiment command to the parser."""
    p = sub.add_parser("experiment", help="run an experiment that tests one of the course's claims")
    p.add_argument("name", nargs="?", help="see --list")
    p.add_argument("--list", action="store_true",
                   help="list the experiments and their claims (with a name: that one's)")
    p.add_argument("--quick", action="store_true", help="a small version (minutes on 2 cores)")
    p.add_argument("--out", default=None, help="output folder (default runs/experiments/NAME)")
    p.add_argument("--resume", action="store_true", help="keep what an earlier run in OUT finished "
                   "and run only what is missing (chomsky, vit-vs-cnn, moe-vs-dense, micrograph-saliency, ssl-recipe: "
                   "their single runs)")
    p.add_argument("--data", default=None, help="the text that scaling, moe-vs-dense and ssm-vs-attention train on "
                   "(default ../shared/data/tinyshakespeare.txt)")
    p.add_argument("--workers", type=int, default=1, help="train this many runs (seeds, rates, arms) at a time, "
                   "each in its own process with one torch thread (results as with 1; default 1)")
    p.set_defaults(func=_cmd_experiment)


def _cmd_experiment(args: argparse.Namespace) -> int:
    from attnlab.core.errors import ConfigError
    from attnlab.experiments import EXPERIMENTS, load

    if args.name and args.name not in EXPERIMENTS:
        raise unknown_name("experiment", args.name, list(EXPERIMENTS))
    if args.list or not args.name:
        running = [flag for flag, given in (("--quick", args.quick), ("--out", args.out is not None),
                                            ("--resume", args.resume), ("--workers", args.workers != 1),
                                            ("--data", args.data is not None)) if given]
        if running:  # they only mean something for a run: a list that ignored them would hide the mistake
            raise ConfigError(f"{' and '.join(running)} only apply to a run, and --list (or no name) only lists: "
                              "leave them out, or name an experiment without --list")
        for name in [args.name] if args.name else EXPERIMENTS:
            print(f"{name:<20} {load(name).CLAIM}")
        return 0
    from attnlab.core.fileio import check_writable_folder

    if args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    from attnlab.core.runtime import usable_cores

    cores = usable_cores()
    if args.workers > cores:  # each worker is a process with one thread: more than the cores only wait
        raise ConfigError(f"--workers {args.workers} is more than this machine's {cores} CPU cores; "
                          f"use at most {cores}")
    out = Path(args.out) if args.out else Path("runs") / "experiments" / args.name
    check_writable_folder(out, "the output folder", ConfigError)  # before any work
    from attnlab.experiments.partial import refuse_foreign_files, refuse_to_overwrite

    if not args.resume:  # a fresh run never destroys unfinished or full-run work kept in OUT, nor one's own files
        refuse_to_overwrite(out, args.name, args.quick)
    else:
        refuse_foreign_files(out, args.name)
    module = load(args.name)
    import inspect

    takes = inspect.signature(module.run).parameters
    if args.resume and "resume" not in takes:
        raise ConfigError(f"experiment {args.name!r} cannot resume; run it again without --resume")
    if args.data is not None and "data" not in takes:
        raise ConfigError(f"experiment {args.name!r} makes its own data; --data applies to "
                          f"{', '.join(n for n in EXPERIMENTS if 'data' in inspect.signature(load(n).run).parameters)}")
    if args.data is not None and not Path(args.data).is_file():
        raise ConfigError(f"--data {args.data} is not a file")
    options = {"quick": args.quick, **({"resume": True} if args.resume else {}),
               **({"data": Path(args.data)} if args.data is not None else {})}
    from attnlab.experiments.study import parallel_runs

    with parallel_runs(args.workers):
        record = module.run(out, **options)
    verdict = {"held": "the claim held", "not held": "the claim did NOT hold",
               "not decidable": "not decidable at this scale"}[record.get("verdict", "held" if record["claim_held"]
                                                                   else "not held")]
    print(f"{args.name}: {verdict} ({record['wall_time_s']} s); report, results.json and plots in {out}")
    return 0
