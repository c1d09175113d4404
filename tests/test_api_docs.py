"""The Python examples of the API reference page (docs/api/index.md) run as written, in order, against tiny
runs in a temporary folder: a character GPT as ``runs/latest`` and a BERT masked LM as ``runs/my-bert``."""

from __future__ import annotations

import re
from pathlib import Path

from attnlab.cli import main
from tests.helpers import tiny_overrides, write_corpus

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api" / "index.md"
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def examples() -> list[str]:
    """The page's ```python blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_the_api_page_has_examples_for_generation_pipelines_and_bert():
    code = "\n".join(examples())
    for call in ("lm.generate(prompts", "attnlab.pipeline(\"text-generation\"", "run_with_cache", "bert.embed",
                 "bert.fill_mask", "attnlab.pipeline(\"fill-mask\""):
        assert call in code, call


def test_the_api_page_examples_run(tmp_path, monkeypatch, capsys):
    corpus = write_corpus(tmp_path / "corpus.txt", 6000)
    bert = dict(data=corpus, out_dir=tmp_path / "runs", name="my-bert", max_iters=4, eval_interval=4, eval_iters=1,
                batch_size=8, log_interval=2, warmup_iters=1, progress="false", bpe_vocab_size=120, block_size=32,
                n_layer=1, n_head=2, d_model=32, mfu="false", sample_tokens=0)
    assert main(["train", str(CONFIGS / "bert-mlm.yaml"), *[f"{k}={v}" for k, v in bert.items()]]) == 0
    text = tmp_path / "plays.txt"  # the examples' prompts in the character vocabulary
    text.write_text(corpus.read_text() + "To be, or not to be. O Romeo, Romeo!\n" * 40, encoding="utf-8")
    assert main(["train", str(CONFIGS / "shakespeare-char.yaml"),
                 *tiny_overrides(text, tmp_path / "runs", name="shakespeare-char-tiny", max_iters=10)]) == 0
    monkeypatch.chdir(tmp_path)  # runs/latest: the GPT, the newest finished run there
    capsys.readouterr()
    namespace: dict = {}
    for block in examples():
        exec(compile(block, str(PAGE), "exec"), namespace)  # the page's own code
    printed = capsys.readouterr().out
    assert "generated_text" in printed and "(1, 5, 32)" in printed  # run_with_cache's resid_pre: "To be", C = 32
