"""The command line: ``attnlab train | resume | sample | eval | inspect | heads | explore | bench |
experiment | lens | import-hf | export | embed | probe | finetune | translate | predict | data | completion``,
and ``attnlab --version``.

A run folder argument may be ``runs/latest``: the newest finished run (``training.runs.resolve_run_dir``).
Every user error (bad config, missing file, unknown character, corrupt checkpoint) ends with one
line on stderr and exit status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import os
import select
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: sys.argv[1:]), run the command, and map errors to exit statuses:
    0 done, 2 a user error (one line), 130 interrupted, 1 an unexpected error (one line + its type), 141
    (128 + SIGPIPE, as for any Unix tool) when stdout's reader went away (``attnlab sample RUN | head``): quietly."""
    from attnlab.cli.parser import build_parser
    from attnlab.core.errors import AttnlabError

    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:  # progress lines reach a file or a pipe (`> log`, `| tee`) as they are printed
        reconfigure(line_buffering=True)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, or a usage error already printed on one line
        return int(e.code or 0)
    try:
        _check_utf8(args)
        if isinstance(getattr(args, "run_dir", None), str):  # every command's run folder: `runs/latest` too
            from attnlab.training.runs import resolve_run_dir

            resolved = resolve_run_dir(args.run_dir)
            args.run_dir = args.run_dir if resolved == Path(args.run_dir) else str(resolved)
        return args.func(args)
    except AttnlabError as e:
        if args.debug:
            raise
        from attnlab.core.schema import cut

        print(f"attnlab: error: {cut(str(e), 1000)}", file=sys.stderr)  # a value quoted in it is cut too
        return 2
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if isinstance(e, BrokenPipeError) and _stdout_closed():  # not another pipe (a socket, a child process)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush writes nowhere
            return 141
        if args.debug:
            raise
        from attnlab.core.oserrors import as_os_error, describe, is_user_error
        from attnlab.core.schema import cut

        os_error = as_os_error(e)
        if is_user_error(os_error):  # a name too long, no permission, a full disk, ulimit -f: the path, what to do
            print(f"attnlab: error: {describe(os_error)}", file=sys.stderr)
            return 2
        msg = cut(str(e).strip().splitlines()[0], 1000) if str(e).strip() else ""
        print(f"attnlab: error: {type(e).__name__}: {msg} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1


def _check_utf8(args) -> None:
    """ConfigError where an argument (a path, a text) is not valid UTF-8: Python keeps such bytes as lone
    surrogates, which no config, card or JSON file can hold, so a folder named so could never be loaded."""
    from attnlab.core.errors import ConfigError

    for name, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    shown = repr(os.fsencode(text))[2:-1]  # the bytes as given: b'out\\xff' -> out\\xff
                    shown = shown if len(shown) <= 120 else "..." + shown[-117:]  # the end: a path's own name
                    raise ConfigError(f"{shown} (the {name} argument) is not valid UTF-8; rename it, or give "
                                      "another") from None


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on its write end)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor (captured), or no poll
        return False
