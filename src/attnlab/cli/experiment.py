"""``attnlab experiment``: run one of the studies in ``attnlab.experiments``."""

from __future__ import annotations

import argparse
import os
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
    p.add_argument("--resume", action="store_true", help="keep the runs that an earlier, cut-off run into OUT "
                   "finished, and run only the rest")
    p.add_argument("--data", default=None, help="the text that scaling, moe-vs-dense and ssm-vs-attention train on "
                   "(default ../shared/data/tinyshakespeare.txt)")
    p.add_argument("--address", default=None, help="run on the Ray cluster at HOST:PORT (started with "
                   "`ray start --head`; default: the RAY_ADDRESS variable, else Ray embedded on this machine)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"],
                   help="where the runs train (auto: cuda where the cluster has GPUs; default cpu)")
    p.add_argument("--workers", type=int, default=None, help="at most this many runs (seeds, rates, arms) at a "
                   "time (default: as many as the cluster's CPUs, or GPUs, fit)")
    p.add_argument("--in-process", action="store_true", help="run every run in this process, one after another, "
                   "without Ray (a breakpoint in a run stops there)")
    p.add_argument("--cpus-per-run", type=int, default=1, help="CPUs (torch threads) each run asks for (default 1)")
    p.add_argument("--gpus-per-run", type=float, default=None,
                   help="the share of one GPU each run asks for with --device cuda (default 0.25: four runs per GPU)")
    p.set_defaults(func=_cmd_experiment)


def _cmd_experiment(args: argparse.Namespace) -> int:
    from attnlab.core.errors import ConfigError
    from attnlab.experiments import EXPERIMENTS, load

    if args.name is not None and not args.name.strip():  # an unset shell variable: not a request for the list
        raise ConfigError("the experiment name is empty (an unset shell variable?); see attnlab experiment --list")
    if args.name and args.name not in EXPERIMENTS:
        raise unknown_name("experiment", args.name, list(EXPERIMENTS))
    if args.list or not args.name:
        running = [flag for flag, given in (("--quick", args.quick), ("--out", args.out is not None),
                                            ("--resume", args.resume), ("--workers", args.workers is not None),
                                            ("--data", args.data is not None), ("--address", args.address is not None),
                                            ("--device", args.device != "cpu"),
                                            ("--cpus-per-run", args.cpus_per_run != 1),
                                            ("--gpus-per-run", args.gpus_per_run is not None),
                                            ("--in-process", args.in_process)) if given]
        if running:  # they only mean something for a run: a list that ignored them would hide the mistake
            raise ConfigError(f"{' and '.join(running)} only apply to a run, and --list (or no name) only lists: "
                              "leave them out, or name an experiment without --list")
        for name in [args.name] if args.name else EXPERIMENTS:
            print(f"{name:<20} {load(name).CLAIM}")
        return 0
    from attnlab.core.fileio import check_writable_folder

    for flag, value in (("--workers", args.workers), ("--cpus-per-run", args.cpus_per_run)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if args.gpus_per_run is not None and args.device == "cpu":
        raise ConfigError("--gpus-per-run applies to --device cuda (or auto)")
    if args.in_process:
        spread = [flag for flag, given in (("--address", args.address is not None), ("--workers", args.workers),
                                            ("--cpus-per-run", args.cpus_per_run != 1),
                                            ("--gpus-per-run", args.gpus_per_run is not None)) if given]
        if spread:
            raise ConfigError(f"{' and '.join(spread)} spread runs over Ray, and --in-process runs them one after "
                              f"another here: leave out one or the other")
    address = None if args.in_process else args.address or os.environ.get("RAY_ADDRESS") or None
    if address is None:  # embedded: this machine's cores are all there is
        from attnlab.core.runtime import usable_cores

        cores = usable_cores()
        for flag, value in (("--workers", args.workers), ("--cpus-per-run", args.cpus_per_run)):
            if value is not None and value > cores:
                raise ConfigError(f"{flag} {value} is more than this machine's {cores} CPU cores; use at most {cores} "
                                  f"(or give --address of a larger Ray cluster)")
    out = Path(args.out) if args.out else Path("runs") / "experiments" / args.name
    check_writable_folder(out, "the output folder", ConfigError)  # before any work
    from attnlab.core.locks import folder_lock
    from attnlab.core.staging import recover

    with folder_lock(out, beside=True, what="the output folder"):  # one study writes OUT at a time
        recover(out)  # what a publication cut off by a kill left beside OUT, resolved before OUT is read
        return _run_study(args, out, address)


def _run_study(args: argparse.Namespace, out: Path, address: str | None) -> int:
    """Check what the run needs, then run the study into ``out`` (whose lock the caller holds)."""
    from attnlab.core.errors import ConfigError
    from attnlab.experiments import EXPERIMENTS, load
    from attnlab.experiments.partial import RUNS, forget_runs, refuse_to_overwrite, refuse_to_resume

    if not args.resume:  # a fresh run never destroys unfinished or full-run work kept in OUT, nor one's own files
        refuse_to_overwrite(out, args.name, args.quick)
    else:
        refuse_to_resume(out, args.name, args.quick)
    module = load(args.name)
    import inspect

    takes = inspect.signature(module.run).parameters
    if args.data is not None and "data" not in takes:
        raise ConfigError(f"experiment {args.name!r} makes its own data; --data applies to "
                          f"{', '.join(n for n in EXPERIMENTS if 'data' in inspect.signature(load(n).run).parameters)}")
    if args.data is not None and not Path(args.data).is_file():
        raise ConfigError(f"--data {args.data} is not a file")
    if args.device != "cpu" and "device" not in takes:
        raise ConfigError(f"experiment {args.name!r} trains nothing (it measures on this machine's CPU); leave out "
                          f"--device")
    spread = [flag for flag, given in (("--address", args.address is not None), ("--workers", args.workers))
              if given and "device" not in takes]
    if spread:  # it runs here, in this process: a cluster or a worker count asked for would be ignored
        raise ConfigError(f"experiment {args.name!r} trains nothing (it measures on this machine's CPU, in this "
                          f"process); leave out {' and '.join(spread)}")
    if not args.quick:  # a full run decides by a rule fixed and committed before it
        from attnlab.experiments.provenance import check_committed, check_registered

        check_registered(args.name, module.rule())
        check_committed()
    from attnlab.core.manifest import sha256
    from attnlab.experiments.engine import InProcess, RayEngine, using

    # what names the kept runs beside each study's protocol: a resume with other data or threads takes none
    context = {"experiment": args.name, "quick": args.quick, "threads": args.cpus_per_run,
               "data": sha256(Path(args.data)) if args.data is not None else None}
    if args.in_process or "device" not in takes:  # an experiment that trains nothing has no runs to spread
        runner = InProcess(keep_root=out / RUNS, device=args.device, context=context, threads=args.cpus_per_run)
    else:
        runner = RayEngine(address=address, cpus_per_run=args.cpus_per_run, gpus_per_run=args.gpus_per_run,
                           max_in_flight=args.workers, device=args.device, keep_root=out / RUNS, context=context)
    with runner, using(runner):
        print(f"{args.name}: {runner.describe()}")
        options = {"quick": args.quick, **({"resume": True} if args.resume and "resume" in takes else {}),
                   **({"data": Path(args.data)} if args.data is not None else {}),
                   **({"device": runner.device} if "device" in takes else {})}
        record = module.run(out, **options)
    forget_runs(out)  # every run is in results.json now
    verdict = {"held": "the claim held", "not held": "the claim did NOT hold",
               "not decidable": "not decidable at this scale"}[record.get("verdict", "held" if record["claim_held"]
                                                                   else "not held")]
    print(f"{args.name}: {verdict} ({record['wall_time_s']} s); report, results.json and plots in {out}")
    return 0
