"""End-to-end: the explorer page in headless Chromium (Playwright, system executable), network cut off.

The server runs for real (uvicorn on a free loopback port); the browser may reach it and nothing
else, so these tests also prove the page works offline (no CDN, no web font).
"""

from __future__ import annotations

import json
import math

import httpx
import pytest

from attnlab.experiments.hand_trace import by_hand
from attnlab.web.server import LOOPBACK_NAMES, create_app
from tests.web_helpers import (
    headless_chromium,
    offline_page,
    running_server,
    skip_module_without_browser,
    train_tiny_run,
)

skip_module_without_browser()

TEXT = "the quick brown fox"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run_dir = train_tiny_run(tmp_path_factory.mktemp("explorer-browser"))
    with running_server(create_app(run_dir, allowed_hosts=LOOPBACK_NAMES)) as url:  # as `serve` configures it
        yield url


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as b:
        yield b


@pytest.fixture
def page(browser, server):
    with offline_page(browser, server) as (page, blocked, errors):
        page.goto(server + "/")
        page.wait_for_selector('body[data-ready="1"]', timeout=20_000)
        yield page
        assert blocked == [], f"the page tried to reach the network: {blocked}"
        assert [e for e in errors if "status of 400" not in e] == []


def signature(matrix) -> str:
    """What app.js's signature() computes: sum of p * (row-major position + 1), 6 decimals."""
    return f"{sum(p * (i * len(row) + j + 1) for i, row in enumerate(matrix) for j, p in enumerate(row)):.6f}"


def run_text(page, text: str) -> None:
    """Type ``text``, run the model, and wait until the page has drawn the new result."""
    runs = int(page.get_attribute("body", "data-runs") or 0)
    page.fill("#text-input", text)
    page.click("#run")
    # a selector, not wait_for_function: the page's CSP forbids the eval that one needs
    page.wait_for_selector(f'body[data-runs="{runs + 1}"]')
    assert page.get_attribute("#heatmap", "data-tokens") == str(len(text))


def heatmap_pixels(page) -> str:
    return page.evaluate("document.getElementById('heatmap').toDataURL()")


def test_text_tab_heatmap_follows_layer_and_head(page, server):
    reference = httpx.post(f"{server}/api/attention", json={"text": TEXT}, timeout=30).json()
    assert "2 layers × 2 heads" in page.text_content("#run-info")
    run_text(page, TEXT)
    assert "19 tokens, 2 attention layers × 2 heads" in page.text_content("#status")
    assert page.locator("#tokens .token").count() == len(TEXT)
    heatmap = page.locator("#heatmap")

    shown = {}
    for layer in (0, 1):
        page.select_option("#layer", str(layer))
        for head in (0, 1):
            page.select_option("#head", str(head))
            assert heatmap.get_attribute("data-layer") == str(layer)
            assert heatmap.get_attribute("data-head") == str(head)
            # the heatmap draws exactly the server's matrix for this layer and head
            assert heatmap.get_attribute("data-signature") == signature(reference["layers"][layer][head])
            shown[layer, head] = heatmap_pixels(page)
    assert len(set(shown.values())) == 4  # four heads, four different pictures

    # the head grid: one thumbnail per head; a click selects that head
    page.select_option("#layer", "1")
    thumbs = page.locator("#head-grid .thumb")
    assert thumbs.count() == 2
    thumbs.nth(0).click()
    assert heatmap.get_attribute("data-head") == "0" and "selected" in thumbs.nth(0).get_attribute("class")
    assert page.input_value("#head") == "0" and heatmap_pixels(page) == shown[1, 0]
    thumbs.nth(1).click()
    assert heatmap.get_attribute("data-head") == "1" and heatmap_pixels(page) == shown[1, 1]

    # hovering a token highlights its row and reads it out
    before = heatmap_pixels(page)
    page.locator("#tokens .token").nth(4).hover()
    assert "token active" in page.locator("#tokens .token").nth(4).get_attribute("class")
    assert '"q" (position 4) attends to:' in page.text_content("#row-readout")
    assert heatmap_pixels(page) != before  # the highlight frame is drawn

    # next-token top 10, most likely first, as the server computed
    items = page.locator("#next-token li")
    assert items.count() == 10
    assert page.locator("#next-token .bar-p").nth(0).text_content() == f"{reference['next_token'][0]['p']:.4f}"


def test_a_bad_text_shows_the_servers_one_line_error(page):
    page.fill("#text-input", "the Zebra")
    page.click("#run")
    status = page.locator("#status.error")
    status.wait_for()
    assert "not in the tokenizer's vocabulary" in status.text_content()


def _weights_row(page, row: int) -> list[float]:
    cells = page.locator(f"#toy-weights tr:nth-child({row + 2}) td")
    return [float(cells.nth(j).get_attribute("data-value") or 0) for j in range(cells.count())]


def test_toy_tab_recomputes_the_hand_trace(page):
    page.click("#tab-toy")
    assert page.is_visible("#panel-toy") and not page.is_visible("#panel-text")
    plain = by_hand(1.0)
    for i in range(4):
        assert _weights_row(page, i) == pytest.approx(plain["weights"][i], abs=1e-12)
    z_a = page.locator("#toy-outputs tr:nth-child(2) td")
    assert [z_a.nth(d).text_content() for d in range(2)] == ["5.3446", "1.6862"]  # the lecture's z_A

    page.check("#toy-scale")
    scaled = by_hand(1 / math.sqrt(2))
    assert _weights_row(page, 0) == pytest.approx(scaled["weights"][0], abs=1e-12)

    page.uncheck("#toy-scale")
    page.check("#toy-causal")  # row A sees only A; row C sees A, B, C
    assert _weights_row(page, 0) == pytest.approx([1, 0, 0, 0])
    masked = page.locator("#toy-scores tr:nth-child(2) td.masked")  # row A's scores for B, C, D
    assert masked.count() == 3 and masked.nth(0).text_content() == "−∞"
    s = plain["scores"][2][:3]
    expected_c = [math.exp(x) / sum(math.exp(y) for y in s) for x in s] + [0]
    assert _weights_row(page, 2) == pytest.approx(expected_c, abs=1e-12)

    page.uncheck("#toy-causal")
    page.fill("#toy-Q-0-0", "3")  # q_A = (3, 0): row A's scores become (3, 0, 3, 3)
    e = [math.exp(x) for x in (3, 0, 3, 3)]
    assert _weights_row(page, 0) == pytest.approx([x / sum(e) for x in e], abs=1e-12)
    page.click("#toy-reset")
    assert _weights_row(page, 0) == pytest.approx(plain["weights"][0], abs=1e-12)


def test_conv_tab_shows_the_receptive_field_against_an_attention_row(page):
    run_text(page, TEXT)
    page.click("#tab-conv")
    canvas = page.locator("#conv-canvas")
    assert canvas.get_attribute("data-position") == str(len(TEXT) - 1)  # starts at the last token
    # click the 11th cell of the convolution band (left 120 + 10 * 24 px, band top 40 px; canvas is unscaled)
    canvas.click(position={"x": 120 + 10 * 24 + 8, "y": 40 + 8})
    assert canvas.get_attribute("data-position") == "10"
    assert canvas.get_attribute("data-reach") == "8-10"  # causal, k = 3, one layer: i-2 .. i
    page.fill("#conv-depth", "4")
    page.dispatch_event("#conv-depth", "input")
    assert canvas.get_attribute("data-reach") == "2-10"  # four layers: i - 4(k-1) .. i
    page.select_option("#conv-k", "5")
    assert canvas.get_attribute("data-reach") == "0-10"  # clipped at the start of the sequence
    page.uncheck("#conv-causal")
    page.fill("#conv-depth", "1")
    page.dispatch_event("#conv-depth", "input")
    assert canvas.get_attribute("data-reach") == "8-12"  # centred: i-2 .. i+2
    summary = page.text_content("#conv-summary")
    assert summary.startswith('position 10 ("b"): the convolution reaches 5 of 19 inputs (positions 8–12)')
    assert "the attention row is non-zero on 11 inputs" in summary  # causal attention: positions 0..10


def test_lens_tab_knocks_out_heads_and_reads_every_layer(page, server, tmp_path):
    """Click a head: the page shows what /api/lens returns for that head knocked out, the logit lens of
    every layer, and downloads the numbers."""
    page.click("#tab-lens")
    page.wait_for_selector('body[data-lens-runs="1"]')
    assert page.inner_text("#lens-ablated").strip() == ""  # nothing knocked out yet
    page.fill("#lens-input", TEXT)
    page.click('#lens-heads button[data-key="1.0"]')
    page.wait_for_selector('body[data-lens-runs="2"]')
    assert "L1H0" in page.inner_text("#lens-loss") and "off" in page.get_attribute(
        '#lens-heads button[data-key="1.0"]', "class")
    want = httpx.post(server + "/api/lens", json={"text": TEXT, "ablate": [[1, 0]]}).json()
    shown = [float(x) for x in page.locator("#lens-ablated .bar-p").all_inner_texts()]
    assert shown == pytest.approx([t["p"] for t in want["ablated_next_token"]], abs=1e-4)
    # the grid: a cell per position and layer (3 layers: embed, block 0, block 1)
    assert page.get_attribute("#lens-grid", "data-cells") == str(3 * len(want["grid"]))
    with page.expect_download() as info:
        page.click("#download-json")
    data = json.loads(info.value.path().read_text(encoding="utf-8"))
    assert data["grid"] == want["grid"]
    assert data["heads"] == ["L1H0"] and [layer["name"] for layer in data["layers"]] == ["embed", "block 0",
                                                                                         "block 1"]


def test_downloads_png_and_json(page, tmp_path):
    run_text(page, TEXT)
    page.select_option("#head", "1")
    with page.expect_download() as info:
        page.click("#download-png")
    png = tmp_path / info.value.suggested_filename
    info.value.save_as(png)
    assert png.name == "attnlab-text.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with page.expect_download() as info:
        page.click("#download-json")
    data = json.loads(info.value.path().read_text(encoding="utf-8"))
    assert data["head"] == 1 and data["tokens"] == list(TEXT) and len(data["attention"]) == len(TEXT)

    page.click("#tab-toy")
    with page.expect_download() as info:
        page.click("#download-json")
    toy = json.loads(info.value.path().read_text(encoding="utf-8"))
    assert toy["outputs"][0] == pytest.approx(by_hand(1.0)["outputs"][0], abs=1e-12)


def test_screenshot(page, tmp_path):
    run_text(page, TEXT)
    page.select_option("#layer", "1")
    shot = page.screenshot(path=str(tmp_path / "explorer.png"), full_page=True)
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000
    for tab in ("toy", "conv"):
        page.click(f"#tab-{tab}")
        assert page.get_attribute("body", "data-tab") == tab
        assert len(page.screenshot(path=str(tmp_path / f"explorer-{tab}.png"))) > 20_000
