"""Fresh screenshots of the explorer for the docs: ``attnlab explore`` on real runs, the page in headless
Chromium (the system browser, network cut off by the page's own policy), one PNG per view.

    python scripts/explorer_screenshots.py --gpt RUN [--bert RUN] [--vit RUN] [--out docs]

Writes explorer.png (GPT text tab: heatmap with its labels and legend, head grid, all-layers overview,
next-token bars), explorer-bert.png, explorer-vit.png (after an upload of a test image), explorer-toy.png
and explorer-conv.png.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.explorer_load import start_explorer  # noqa: E402
from tests.web_helpers import headless_chromium  # noqa: E402


def shoot(browser, run: Path, out: Path, views: list[tuple[str, str | None]], text: str | None = None) -> None:
    proc, url, _ = start_explorer(run)
    try:
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(url + "/")
        page.wait_for_selector('body[data-ready="1"]', timeout=30_000)
        if text is not None:
            page.fill("#text-input", text)
            page.click("#run")
            page.wait_for_selector('body[data-runs="1"]', timeout=30_000)
        for name, tab in views:
            if tab is not None:
                page.click(f'.tab[data-tab="{tab}"]')
                page.wait_for_timeout(300)
            page.screenshot(path=str(out / name), full_page=True)
            print("wrote", out / name)
        page.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def upload_digit(browser, run: Path, out: Path) -> None:
    from PIL import Image

    from attnlab.data.images import load_digits

    proc, url, _ = start_explorer(run)
    try:
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(url + "/")
        page.wait_for_selector('body[data-ready="1"]', timeout=30_000)
        image = Image.fromarray(load_digits().images[7, 0].numpy())
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        upload = {"name": "digit.png", "mimeType": "image/png", "buffer": buffer.getvalue()}
        page.set_input_files("#image-input", upload)
        page.click("#run-image")
        page.wait_for_selector('body[data-image-runs="1"]', timeout=30_000)
        page.screenshot(path=str(out / "explorer-vit.png"), full_page=True)
        print("wrote", out / "explorer-vit.png")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpt", required=True)
    ap.add_argument("--bert")
    ap.add_argument("--vit")
    ap.add_argument("--out", default=str(ROOT / "docs"))
    args = ap.parse_args()
    out = Path(args.out)
    with headless_chromium() as browser:
        shoot(browser, Path(args.gpt), out, [("explorer.png", None), ("explorer-toy.png", "toy"),
                                             ("explorer-conv.png", "conv")], text="ROMEO:\nBut soft, what light")
        if args.bert:
            shoot(browser, Path(args.bert), out, [("explorer-bert.png", None)],
                  text="romeo, [MASK] art thou romeo?")
        if args.vit:
            upload_digit(browser, Path(args.vit), out)


if __name__ == "__main__":
    main()
