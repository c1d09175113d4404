"""attnlab.inspect.plots: every figure renders to PNG and SVG with the expected labels."""

from __future__ import annotations

import torch

from attnlab.inspect import plots


def texts(fig) -> set[str]:
    return {t.get_text() for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels() + ax.texts}


def test_heatmap_png_and_svg(tmp_path):
    probs = torch.softmax(torch.randn(5, 5), -1)
    fig = plots.heatmap(probs, list("ab cd"), title="blocks.0.mixer head 1")
    assert {"a", "␣", "d"} <= texts(fig)
    paths = plots.save(fig, tmp_path / "head")
    assert [p.name for p in paths] == ["head.png", "head.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in paths[1].read_bytes()[:500]


def test_token_labels_show_whitespace_and_escape_other_control_characters():
    """A character tokenizer's specials are control characters ("\\x02"), which no font draws: they are written
    as escapes; common whitespace keeps its visible symbol; other text is left as it is."""
    assert [plots.token_label(t) for t in (" a", "\n", "\t", "\x02", "\x00b", "\u3000", "é", "")] == [
        "␣a", "⏎", "⇥", "\\x02", "\\x00b", "\u3000", "é", "∅"]
    assert plots.token_label("\x02" * 5, max_len=6) == "\\x02\\…"


def test_grid_overview_alignment_attribution(tmp_path):
    grid = plots.head_grid(torch.softmax(torch.randn(3, 6, 6), -1), list("abcdef"), "layer 0")
    assert sum(ax.get_title().startswith("head") for ax in grid.axes) == 3
    plots.save(grid, tmp_path / "grid", ("png",))
    m = torch.tensor([[0.5, float("nan")], [1.0, 2.0]])
    overview = plots.layer_head_overview(m, ["layer 0", "layer 1"], "entropy")
    assert {"0.50", "–", "2.00", "h1", "layer 1"} <= texts(overview)
    align = plots.cross_attention_alignment(torch.softmax(torch.randn(3, 4), -1), ["le", "chat", "noir", "."],
                                            ["the", "black", "cat"])
    assert {"le", "cat"} <= texts(align)
    bars = plots.attribution_comparison(list("xyz"), {"rollout": torch.tensor([1.0, 2, 3]),
                                                      "IG": torch.tensor([-1.0, 0, 4])})
    assert [ax.get_ylabel() for ax in bars.axes] == ["rollout", "IG"]
    for name, fig in (("overview", overview), ("align", align), ("bars", bars)):
        assert plots.save(fig, tmp_path / name, ("svg",))[0].stat().st_size > 1000


def test_toy_example_shows_the_lecture_numbers(tmp_path):
    fig = plots.toy_example(scale=False)
    t = texts(fig)
    assert {"0.297", "0.109", "5.345", "1.686", "query A", "key D"} <= t  # row A: softmax(1,0,1,1); z_A
    causal = texts(plots.toy_example(scale=True, causal=True))
    assert "−∞" in causal and "1.000" in causal  # row A attends only to itself
    plots.save(fig, tmp_path / "toy")
