"""Screenshots of the explorer on a BERT and a ViT run: docs/explorer-bert.png and docs/explorer-vit.png.

    PYTHONPATH=src python scripts/explorer_screenshot_families.py --bert RUN_DIR [--text "..."] [--click 3]
    PYTHONPATH=src python scripts/explorer_screenshot_families.py --vit RUN_DIR [--digit 0] [--layer -1]

BERT: runs the text (with a [MASK]), optionally clicks one more token to mask it. ViT: saves one test
image of the 8x8 digits as PNG, uploads it through the page, picks a map (-1 = rollout). The server and
the system Chromium run as in the browser tests (network cut off).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.web_helpers import headless_chromium, offline_page, running_server  # noqa: E402

from attnlab.web.server import create_app  # noqa: E402


def shoot(run_dir: str, out: Path, act) -> None:
    with running_server(create_app(run_dir)) as url, headless_chromium() as browser, \
            offline_page(browser, url, viewport=(1280, 900)) as (page, blocked, errors):
        page.goto(url + "/")
        page.wait_for_selector('body[data-ready="1"]', timeout=30_000)
        act(page)
        page.screenshot(path=str(out))
        if blocked or [e for e in errors if "status of 400" not in e]:
            raise SystemExit(f"the page reached out or failed: {blocked} {errors}")
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bert", help="a bert run folder")
    ap.add_argument("--text", default="ROMEO: But soft, what [MASK] through yonder window breaks?")
    ap.add_argument("--click", type=int, default=None, help="token position to mask by a click")
    ap.add_argument("--vit", help="a vit run folder (trained on the 8x8 digits)")
    ap.add_argument("--digit", type=int, default=0, help="index of the test image to upload")
    ap.add_argument("--layer", type=int, default=-1, help="-1: the rollout")
    ap.add_argument("--head", type=int, default=0)
    ap.add_argument("--out-dir", default=str(ROOT / "docs"))
    args = ap.parse_args()
    out = Path(args.out_dir)
    if args.bert:
        def bert(page) -> None:
            page.fill("#text-input", args.text)
            page.click("#run")
            page.wait_for_selector('body[data-runs="2"]')
            if args.click is not None:
                page.locator("#tokens .token").nth(args.click).click()
                page.wait_for_selector('body[data-runs="3"]')

        shoot(args.bert, out / "explorer-bert.png", bert)
    if args.vit:
        from PIL import Image

        from attnlab.data.images import load_splits

        image = load_splits("digits", 1, 8, 0.1, 0.2)["test"].images[args.digit, 0]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"digit-{args.digit}.png"
            Image.fromarray(image.numpy()).save(path)

            def vit(page) -> None:
                page.set_input_files("#image-input", str(path))
                page.click("#run-image")
                page.wait_for_selector('body[data-image-runs="1"]')
                page.select_option("#image-layer", str(args.layer))
                if args.layer >= 0:
                    page.select_option("#image-head", str(args.head))

            shoot(args.vit, out / "explorer-vit.png", vit)


if __name__ == "__main__":
    main()
