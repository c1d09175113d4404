"""``attnlab.load``: batched generation equal to each prompt alone, run_with_cache, a BERT's embeddings, guesses
and maps, Hugging Face folders read in memory, and one-line refusals for what a model cannot do."""

from __future__ import annotations

import json

import pytest
import torch

import attnlab
from attnlab.api import cut_at_stop
from attnlab.api_generate import generate_rows
from attnlab.cli import main
from attnlab.core.errors import AttnlabError, CheckpointError, ConfigError
from attnlab.generation import SamplingConfig, generate
from attnlab.models import ModelConfig, build_model
from tests.helpers import train_tiny_run

PROMPTS = ["The quick brown", "a", "Over a lazy dog"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tests.web_helpers import train_tiny_bert

    tmp = tmp_path_factory.mktemp("api")
    gpt = train_tiny_run(tmp, max_iters=30)
    (tmp / "b").mkdir()
    bert = train_tiny_bert(tmp / "b")
    assert main(["export", str(gpt), "--out", str(tmp / "gpt-hf")]) == 0
    assert main(["export", str(bert), "--out", str(tmp / "bert-hf")]) == 0
    return {"gpt": gpt, "bert": bert, "gpt-hf": tmp / "gpt-hf", "bert-hf": tmp / "bert-hf", "tmp": tmp}


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi", "relative"])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_each_left_padded_row_is_its_prompt_generated_alone(positions, backend):
    torch.manual_seed(0)
    model = build_model(ModelConfig.from_mapping(dict(family="gpt", vocab_size=40, n_layer=2, n_head=2, d_model=32,
                                                      block_size=16, positions=positions, attn_backend=backend)))
    rows = [[1, 2, 3, 4, 5, 6, 7], [8, 9], [3, 3, 3, 3]]
    cfg = SamplingConfig(max_new_tokens=14, temperature=0)  # 7 + 14 > 16: the window slides too
    batched = generate_rows(model, rows, cfg, lambda b, new: False)
    alone = [generate(model, torch.tensor([r]), cfg)[0, len(r):].tolist() for r in rows]
    assert batched == alone and len({tuple(a) for a in alone}) == 3


def test_generate_takes_a_list_as_one_batch_and_gives_str_for_str(runs):
    lm = attnlab.load(runs["gpt"])
    options = dict(max_new_tokens=12, temperature=0, repetition_penalty=1.5)  # the penalty varies the greedy text
    texts = lm.generate(PROMPTS, **options)
    assert isinstance(texts, list) and texts == [lm.generate(p, **options) for p in PROMPTS]
    assert all(t.startswith(p) for t, p in zip(texts, PROMPTS, strict=True))
    one = lm.generate("a", max_new_tokens=5, temperature=0)
    assert isinstance(one, str) and len(one) == 6
    stop = [texts[0][len(PROMPTS[0])]]  # the first new character of the first row
    stopped = lm.generate(PROMPTS, stop=stop, **options)
    assert stopped[0] == texts[0][:len(PROMPTS[0]) + 1]  # each row ends after its first stop string
    assert stopped == [p + cut_at_stop(t[len(p):], stop) for p, t in zip(PROMPTS, texts, strict=True)]
    with pytest.raises(ConfigError, match="expected the prompts as a str or a list of str, got int"):
        lm.generate(["a", 3])


def test_run_with_cache_gives_the_logits_and_the_hook_points(runs):
    lm = attnlab.load(runs["gpt"])
    logits, cache = lm.run_with_cache("the fox")
    assert torch.equal(logits, lm.model(lm.ids("the fox")).logits)
    assert cache["blocks.0.hook_resid_pre"].shape == (1, 7, lm.model.config.d_model)
    _, patterns = lm.run_with_cache("the fox", "*hook_pattern")
    assert len(patterns) == lm.model.config.n_layer


def test_a_bert_embeds_fills_masks_and_reads_its_text_between_cls_and_sep(runs):
    from attnlab.inspect.encoders import embed_texts

    b = attnlab.load(runs["bert"])
    assert b.task == "mlm"
    emb = b.embed(["the fox", "a lazy dog"])
    assert emb.shape == (2, 32) and torch.equal(b.embed("the fox"), emb[0])
    torch.testing.assert_close(emb, embed_texts(b.model, b.tokenizer, ["the fox", "a lazy dog"]))  # attnlab embed's
    guesses = b.fill_mask("the quick [MASK] fox", top_k=3)
    assert len(guesses) == 1 and len(guesses[0]) == 3
    best = guesses[0][0]
    assert best["sequence"] == f"the quick {best['token_str']} fox" and guesses[0][1]["score"] <= best["score"]
    assert [len(g) for g in b.fill_mask("[MASK] fox [MASK]", top_k=2)] == [2, 2]
    maps = b.attention("the fox")
    assert maps[0].shape[-1] == len(b.tokenizer.encode("the fox")) + 2  # [CLS] and [SEP]
    logits, _ = b.run_with_cache("the fox")
    assert logits.shape == (1, maps[0].shape[-1], b.model.config.vocab_size)
    assert b.predict("the [MASK] fox")["prediction"].startswith("the ")


def test_exported_hugging_face_folders_load_in_memory_and_answer_as_the_run(runs):
    run, hf = attnlab.load(runs["gpt"]), attnlab.load(runs["gpt-hf"])
    assert hf.generate(PROMPTS, max_new_tokens=8, temperature=0) == run.generate(PROMPTS, max_new_tokens=8,
                                                                                  temperature=0)
    torch.testing.assert_close(attnlab.load(runs["bert-hf"]).embed("the fox"), attnlab.load(runs["bert"]).embed(
        "the fox"), atol=1e-5, rtol=0)
    assert not (runs["gpt-hf"] / "attnlab_model.safetensors").exists()  # read in memory: nothing written there


def test_an_unknown_hugging_face_architecture_is_one_line(runs, tmp_path):
    folder = tmp_path / "t5"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 8}))
    with pytest.raises(CheckpointError, match="model_type 't5' is not one attnlab reads"):
        attnlab.load(folder)


@pytest.mark.parametrize("call, message", [
    (lambda g, b: b.generate("the fox"), "generate needs a gpt model"),
    (lambda g, b: g.embed("the fox"), "embed needs a bert model"),
    (lambda g, b: g.fill_mask("the [MASK]"), "fill_mask needs a bert model"),
    (lambda g, b: b.fill_mask("the fox"), r"no \[MASK\]"),
    (lambda g, b: b.predict(["a"], batch_size=0), "batch_size must be an integer"),
    (lambda g, b: g.attention(["a"]), "expected the text as a str, got list"),
    (lambda g, b: b.embed([]), "got an empty list"),
])
def test_what_a_model_cannot_do_is_one_line(runs, call, message):
    g, b = attnlab.load(runs["gpt"]), attnlab.load(runs["bert"])
    with pytest.raises(AttnlabError, match=message) as e:
        call(g, b)
    assert "\n" not in str(e.value)
