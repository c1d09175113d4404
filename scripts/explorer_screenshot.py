"""Screenshots of the explorer for the README: docs/explorer.png (text tab), explorer-toy.png, explorer-conv.png.

    PYTHONPATH=src python scripts/explorer_screenshot.py RUN_DIR [--text "..."] [--layer 1 --head 2]

Serves RUN_DIR on a free loopback port, drives the system Chromium headless (network cut off, as in
the browser tests), runs the text, picks the layer/head, hovers one token, and saves the three tabs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.web_helpers import headless_chromium, offline_page, running_server  # noqa: E402

from attnlab.web.server import create_app  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--text", default="ROMEO:\nBut soft, what light through yonder window breaks?")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--head", type=int, default=0)
    ap.add_argument("--hover", type=int, default=None, help="token to hover (default: the last)")
    ap.add_argument("--conv-position", type=int, default=None)
    ap.add_argument("--out-dir", default=str(ROOT / "docs"))
    args = ap.parse_args()
    out = Path(args.out_dir)
    with running_server(create_app(args.run_dir)) as url, headless_chromium() as browser, \
            offline_page(browser, url, viewport=(1280, 1010)) as (page, blocked, errors):
        page.goto(url + "/")
        page.wait_for_selector('body[data-ready="1"]', timeout=30_000)
        page.fill("#text-input", args.text)
        page.click("#run")
        page.wait_for_selector('body[data-runs="2"]')  # the example at start-up, then this text
        page.select_option("#layer", str(args.layer))
        page.select_option("#head", str(args.head))
        hover = args.hover if args.hover is not None else len(args.text) - 1
        page.locator("#tokens .token").nth(hover).hover()
        page.screenshot(path=str(out / "explorer.png"))
        page.click("#tab-toy")
        page.check("#toy-scale")
        page.screenshot(path=str(out / "explorer-toy.png"))
        page.click("#tab-conv")
        page.select_option("#conv-k", "3")
        page.fill("#conv-depth", "2")
        page.dispatch_event("#conv-depth", "input")
        if args.conv_position is not None:
            page.evaluate(f"state.convPos = {args.conv_position}; drawConv();")
        page.screenshot(path=str(out / "explorer-conv.png"))
        if blocked or errors:
            raise SystemExit(f"the page reached out or failed: {blocked} {errors}")
    print(f"wrote {out / 'explorer.png'}, explorer-toy.png, explorer-conv.png")


if __name__ == "__main__":
    main()
