"""attnlab.inspect.faithfulness: the presence vector z switches features exactly (z = 1 is the input,
z = 0 the baseline input), integrated gradients is complete, occlusion is the one-feature removal, the
curves run from the input to the baseline, a model that reads one feature is explained by it, and the
sampled methods are reproducible from their seed; the experiment's verdict rule says "not decidable"
when the gap is within 2 sd."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.inspect.faithfulness import METHODS, attribute, curves, curves_of, for_token_classifier, for_vit
from attnlab.models import BertConfig, ViTConfig, build_model
from tests.helpers import train_tiny_run


def vit():
    torch.manual_seed(0)
    m = build_model(ViTConfig(image_size=16, patch_size=4, in_channels=1, n_classes=10, n_layer=2, n_head=2,
                              d_model=32, d_ff=64)).eval()
    torch.nn.init.normal_(m.head.weight, std=1.0)  # the ViT head starts at zero
    return m


def bert():
    torch.manual_seed(0)
    m = build_model(BertConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, d_model=32, n_classes=3,
                               init_std=0.2)).eval()
    return m


IDS = torch.tensor([[1, 7, 9, 12, 30, 5, 2]])  # [CLS] ... [SEP] of a toy vocabulary
MASK = 4


def text_example():
    m = bert()
    return m, for_token_classifier(m, lambda ids: m(ids).logits, IDS, m.embeddings.tok_emb, range(1, 6), MASK, "cls")


def test_presence_one_is_the_input_and_zero_the_baseline_input():
    m, ex = text_example()
    with torch.no_grad():
        assert torch.equal(ex.logits(torch.ones(1, 5)), m(IDS).logits)
        masked = IDS.clone()
        masked[0, 1:6] = MASK
        assert torch.allclose(ex.logits(torch.zeros(1, 5)), m(masked).logits, atol=1e-6)
        one_off = torch.ones(1, 5)
        one_off[0, 2] = 0
        masked = IDS.clone()
        masked[0, 3] = MASK
        assert torch.allclose(ex.logits(one_off), m(masked).logits, atol=1e-6)
    v = vit()
    image = torch.randn(1, 16, 16, generator=torch.Generator().manual_seed(1))
    ex = for_vit(v, image)
    with torch.no_grad():
        assert torch.allclose(ex.logits(torch.ones(1, 16)), v(image[None]).logits, atol=1e-6)
        assert torch.allclose(ex.logits(torch.zeros(1, 16)), v(torch.zeros(1, 1, 16, 16)).logits, atol=1e-5)
        z = torch.ones(1, 16)
        z[0, 5] = 0  # patch 5: row 1, column 1 of the 4x4 grid
        erased = image.clone()
        erased[:, 4:8, 4:8] = 0
        assert torch.allclose(ex.logits(z), v(erased[None]).logits, atol=1e-5)


def test_integrated_gradients_is_complete_and_occlusion_is_the_single_removal():
    _, ex = text_example()
    s = attribute(ex, ["integrated_gradients", "occlusion"], n_steps=64)
    with torch.no_grad():
        f1 = ex.logits(torch.ones(1, 5))[0, ex.target]
        f0 = ex.logits(torch.zeros(1, 5))[0, ex.target]
        for i in range(5):
            z = torch.ones(1, 5)
            z[0, i] = 0
            assert s["occlusion"][i] == pytest.approx(float(f1 - ex.logits(z)[0, ex.target]), abs=1e-5)
    assert float(s["integrated_gradients"].sum()) == pytest.approx(float(f1 - f0), rel=0.02, abs=1e-3)


def test_curves_run_from_the_input_to_the_baseline():
    _, ex = text_example()
    c = curves(ex, torch.arange(5.0))
    p_in, p_base = ex.prob(torch.ones(1, 5))[0], ex.prob(torch.zeros(1, 5))[0]
    assert c.deletion[0] == pytest.approx(float(p_in)) and c.deletion[-1] == pytest.approx(float(p_base))
    assert c.insertion[0] == pytest.approx(float(p_base)) and c.insertion[-1] == pytest.approx(float(p_in))
    assert len(c.deletion) == 6 and 0 <= c.deletion_auc <= 1


def test_curves_of_several_rankings_in_one_batch_are_each_rankings_own_curves():
    """Row k of a curve removes (deletion) or keeps (insertion) the k top-ranked features, ties broken by
    position: built here one feature at a time, scored one ranking at a time."""
    _, ex = text_example()
    rankings = {"ties": torch.tensor([1.0, 3.0, 1.0, 3.0, 0.0]), "order": torch.arange(5.0),
                "reverse": -torch.arange(5.0)}
    together = curves_of(ex, rankings)
    for name, scores in rankings.items():
        top, order = torch.zeros(6, 5), torch.argsort(-scores, stable=True)
        for k in range(1, 6):
            top[k] = top[k - 1]
            top[k, order[k - 1]] = 1.0
        torch.testing.assert_close(together[name].deletion, ex.prob(1 - top), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(together[name].insertion, ex.prob(top), atol=1e-6, rtol=1e-5)
    assert together["ties"].deletion.tolist() != together["order"].deletion.tolist()


def test_a_model_that_reads_one_feature_is_explained_by_it():
    """The classifier looks only at the embedding of position 3: every attribution puts it first, and its
    deletion curve falls at once (AUC below the random order's)."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(40, 8)
    head = torch.nn.Linear(8, 2)
    model = torch.nn.ModuleDict({"emb": emb, "head": head})

    def run(ids):
        return head(emb(ids)[:, 3])

    with torch.no_grad():
        head.weight.copy_(torch.stack([emb.weight[IDS[0, 3]], -emb.weight[IDS[0, 3]]]) * 3)
        head.bias.zero_()
    ex = for_token_classifier(model, run, IDS, emb, range(1, 6), MASK, "cls", target=0)
    methods = [m for m in METHODS if m not in ("attention", "rollout")]
    scores = attribute(ex, methods, n_samples=100)
    for name in ("gradient_x_input", "integrated_gradients", "occlusion", "lime", "kernel_shap"):
        assert int(scores[name].argmax()) == 2, name  # position 3 is feature 2 (features start at 1)
    assert curves(ex, scores["occlusion"]).deletion_auc < curves(ex, scores["random"]).deletion_auc


def test_sampled_methods_repeat_with_their_seed_and_attention_reads_the_cls_row():
    _, ex = text_example()
    a = attribute(ex, ["lime", "kernel_shap", "random", "attention", "rollout"], n_samples=60, seed=3)
    b = attribute(ex, ["lime", "kernel_shap", "random"], n_samples=60, seed=3)
    for k in b:
        assert torch.equal(a[k], b[k])
    assert a["attention"].shape == (5,) and (a["attention"] >= 0).all() and float(a["attention"].sum()) <= 1 + 1e-6
    with pytest.raises(Exception, match="unknown attribution"):
        attribute(ex, ["saliency"])


def test_inspect_faithfulness_on_a_gpt_run(tmp_path, capsys):
    from attnlab.cli import main

    run = train_tiny_run(tmp_path)
    out = tmp_path / "f.json"
    assert main(["inspect", str(run), "--text", "the quick", "--faithfulness", str(out), "--samples", "20"]) == 0
    r = json.loads(out.read_text())
    assert r["features"] == list("the quick") and {m["method"] for m in r["methods"]} == set(METHODS)
    assert r["explained"].startswith("next token") and "insertion" in capsys.readouterr().out
    for argv, message in ((["--samples", "5"], "--samples: must be an integer >= 10"),
                          ([], "--faithfulness /nonexistent")):
        target = "/nonexistent/f.json" if not argv else str(out)
        assert main(["inspect", str(run), "--text", "the", "--faithfulness", target, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
