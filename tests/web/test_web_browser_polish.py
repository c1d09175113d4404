"""The explorer as a person sees it (headless Chromium, network cut off): token labels that fit and never
run together ([CLS], [MASK] and word pieces included), a colour legend on the heatmap, next-token bars on
the probability scale, a status line that belongs to its tab, and an overview of every layer and head."""

from __future__ import annotations

import pytest

from tests.web_helpers import (
    headless_chromium,
    open_page,
    skip_module_without_browser,
    train_tiny_bert,
    train_tiny_run,
)

skip_module_without_browser()


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as b:
        yield b


def run_text(page, text):
    runs = int(page.get_attribute("body", "data-runs") or 0)
    page.fill("#text-input", text)
    page.click("#run")
    page.wait_for_selector(f'body[data-runs="{runs + 1}"]')


def test_bert_labels_fit_stand_apart_and_the_heatmap_has_a_legend(browser, tmp_path):
    def body(page, url):
        run_text(page, "romeo [MASK] juliet")
        data = page.eval_on_selector("#heatmap", "c => ({...c.dataset})")
        assert data["labels"] == "1" and data["legend"] == "0-1"
        # the widest label ("[MASK]" or "[CLS]") fits in the room left for it: nothing is clipped
        assert float(data["labelRoom"]) >= float(data["widestLabel"]) + 4
        # column labels stand upright, one per 12 px font line: neighbours cannot run together
        assert int(data["cell"]) >= 12

    open_page(browser, train_tiny_bert(tmp_path), body)


def test_gpt_page_bars_status_and_overview(browser, tmp_path):
    run = train_tiny_run(tmp_path)

    def body(page, url):
        run_text(page, "the quick brown fox")
        read = ("items => items.map(li => [Number(li.dataset.p), "
                "li.querySelector('.bar').getBoundingClientRect().width])")
        bars = page.eval_on_selector_all("#next-token li", read)
        assert len(bars) == 10
        for p, width in bars:  # the full width (180 px) is p = 1, whatever the top-1 probability is
            assert abs(width - max(1, round(180 * p))) <= 1
        status = page.text_content("#status")
        assert "tokens" in status
        page.click('.tab[data-tab="toy"]')
        assert page.text_content("#status") == ""  # the Text tab's line is not the Toy tab's
        page.click('.tab[data-tab="text"]')
        assert page.text_content("#status") == status
        overview = page.eval_on_selector("#layer-overview", "b => ({...b.dataset})")
        thumbs = page.locator("#layer-overview canvas.overview-thumb")
        assert thumbs.count() == int(overview["layers"]) * int(overview["heads"]) >= 4
        page.click('#layer-overview canvas[data-layer="1"][data-head="1"]')
        assert page.get_attribute("#heatmap", "data-head") == "1"
        assert page.get_attribute("#heatmap", "data-layer") == page.eval_on_selector(
            "#layer", "s => s.options[1].textContent.split(' ')[1]")
        assert page.locator("#layer-overview canvas.selected").count() == 1

    open_page(browser, run, body)
