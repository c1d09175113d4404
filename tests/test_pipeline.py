"""``attnlab.pipeline(task, model)``: each task on a tiny run of its family, answering in transformers' shapes,
and a model that cannot do the task refused in one line when the pipeline is made."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import attnlab
from attnlab.cli import main
from attnlab.core.errors import ConfigError
from attnlab.data.labelled import generate_topics, write_labelled_csv
from tests.cli.test_predict import SMALL, TINY  # the tiny budgets of predict's runs
from tests.helpers import train_tiny_run, write_corpus


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline")
    topics = write_labelled_csv(generate_topics(60, seed=1), tmp / "topics.csv")
    specs = {
        "mlm": ["bert-mlm", f"data={write_corpus(tmp / 'corpus.txt', 4000)}", "batch_size=4", "bpe_vocab_size=200",
                "model.block_size=32", *SMALL],
        "classify": ["bert-solubility", "task=classify", "tokenizer=wordpiece", f"data={topics}", "bpe_vocab_size=200",
                     "batch_size=8", "model.block_size=32", *SMALL],
        "regress": ["bert-solubility", "batch_size=8", *SMALL],
        "cnn": ["cnn-digits", "batch_size=8", "model.cnn_width=8"],
    }
    folders = {"gpt": train_tiny_run(tmp, max_iters=10)}
    for name, (preset, *overrides) in specs.items():
        out = tmp / "runs" / name
        assert main(["train", preset, f"out_dir={out}", *overrides, *TINY]) == 0, name
        folders[name] = next(out.iterdir())
    digits = tmp / "digits"
    digits.mkdir()
    for i in range(2):
        Image.fromarray(np.full((8, 8), 100 * i, dtype=np.uint8)).save(digits / f"{i}.png")
    folders["images"] = digits
    return folders


def test_text_generation_answers_as_transformers_for_a_list_and_a_str(runs):
    generator = attnlab.pipeline("text-generation", runs["gpt"], temperature=0)
    out = generator(["The quick", "a"], max_new_tokens=6)
    assert [len(r) for r in out] == [1, 1] and out[0][0]["generated_text"].startswith("The quick")
    assert len(out[1][0]["generated_text"]) == 7
    assert generator("a", max_new_tokens=6) == out[1]  # one prompt: [{"generated_text": ...}]
    lm = attnlab.load(runs["gpt"])
    assert attnlab.pipeline("text-generation", lm)("a", max_new_tokens=3, temperature=0)[0]["generated_text"] == \
        lm.generate("a", max_new_tokens=3, temperature=0)


def test_fill_mask_and_feature_extraction_answer_as_transformers(runs):
    fill = attnlab.pipeline("fill-mask", runs["mlm"])
    one = fill("the quick [MASK] fox", top_k=3)
    assert len(one) == 3 and set(one[0]) == {"score", "token", "token_str", "sequence"}
    assert [len(m) for m in fill("[MASK] quick [MASK] fox", top_k=2)] == [2, 2]  # a list per [MASK]
    both = fill(["the [MASK] fox", "a [MASK] dog"], top_k=2)
    assert both[0] == fill("the [MASK] fox", top_k=2) and both[1][0]["sequence"].endswith("dog")
    features = attnlab.pipeline("feature-extraction", runs["mlm"])("the fox")
    loaded = attnlab.load(runs["mlm"])
    assert len(features) == 1 and len(features[0]) == loaded.ids("the fox").size(1)  # (1, T, C), [CLS] and [SEP]
    torch.testing.assert_close(torch.tensor(features[0]), loaded.model(loaded.ids("the fox")).hidden_states[0])


def test_text_classification_regression_and_image_classification(runs):
    classify = attnlab.pipeline("text-classification", runs["classify"])
    rows = classify(["the striker scored a goal", "the market fell"])
    assert len(rows) == 2 and set(rows[0]) == {"label", "score"} and 0 < rows[0]["score"] <= 1
    assert classify("the market fell") == [rows[1]]
    top = classify("the market fell", top_k=3)
    assert len(top) == 3 and abs(sum(r["score"] for r in classify("the market fell", top_k=10)) - 1) < 1e-5
    assert attnlab.load(runs["classify"]).predict("the market fell")["prediction"] == rows[1]["label"]
    values = attnlab.pipeline("regression", runs["regress"])(["CCO", "c1ccccc1"])
    assert len(values) == 2 and isinstance(values[0][0]["value"], float)
    assert values[0][0]["value"] == pytest.approx(attnlab.load(runs["regress"]).predict("CCO")["prediction"][0],
                                                  rel=1e-5)
    images = attnlab.pipeline("image-classification", runs["cnn"])
    per_image = images([str(runs["images"] / "0.png"), str(runs["images"] / "1.png")])
    assert len(per_image) == 2 and len(per_image[0]) == 5 and per_image[0][0]["score"] >= per_image[0][1]["score"]
    assert images(str(runs["images"] / "0.png")) == per_image[0]


@pytest.mark.parametrize("task, run, message", [
    ("text-generation", "mlm", "text-generation needs a gpt model; .* holds a bert"),
    ("fill-mask", "gpt", "fill-mask needs a bert model"),
    ("fill-mask", "classify", "fill-mask needs a model trained for mlm; .* was trained for classify"),
    ("text-classification", "mlm", "needs a model trained for classify"),
    ("image-classification", "gpt", "needs a vit or cnn model"),
    ("regression", "classify", "trained for regress"),
    ("summarization", "gpt", "unknown task 'summarization'; choose one of text-generation, fill-mask"),
])
def test_a_model_that_cannot_do_the_task_is_refused_in_one_line(runs, task, run, message):
    with pytest.raises(ConfigError, match=message) as e:
        attnlab.pipeline(task, runs[run])
    assert "\n" not in str(e.value)
