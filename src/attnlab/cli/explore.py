"""``attnlab explore``: the offline web explorer (``attnlab.web.server``)."""

from __future__ import annotations

import argparse

from attnlab.cli.errors import at_least


def register(sub: argparse._SubParsersAction) -> None:
    """Add the explore command to the parser."""
    p = sub.add_parser("explore", help="the offline web explorer: attention maps, toy example, conv vs attention")
    p.add_argument("run_dir")
    p.add_argument("--port", type=at_least(1), default=8000)
    p.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only); an address "
                   "beyond loopback (0.0.0.0) makes the unauthenticated explorer reachable from the network; on "
                   "any address it answers only requests addressed to this machine, and from its own page")
    p.set_defaults(func=_cmd_explore)


def _cmd_explore(args: argparse.Namespace) -> int:
    from attnlab.core.extras import require

    require("fastapi", "attnlab explore")
    require("uvicorn", "attnlab explore")
    from attnlab.web.server import serve

    serve(args.run_dir, host=args.host, port=args.port)
    return 0
