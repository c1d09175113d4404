"""BERT: the model's invariants, and parity with transformers' BERT in both directions (random init)."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.core.errors import CheckpointError, ConfigError
from attnlab.interop.bert import load_bert, save_bert
from attnlab.models import ModelConfig, build_model
from attnlab.models.bert import Bert, mean_pool
from attnlab.models.registry import from_pretrained

transformers = pytest.importorskip("transformers")


def _bert(**extra) -> Bert:
    torch.manual_seed(0)
    cfg = dict(family="bert", vocab_size=50, block_size=32, n_layer=2, n_head=4, d_model=32, norm_position="post",
               norm_eps=1e-12, attn_backend="eager", n_classes=3)
    config = ModelConfig.from_mapping({**cfg, **extra})
    config.validate()
    return build_model(config).eval()


def _batch(V=50, B=3, T=12, lengths=(12, 7, 3), seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()  # (B, T)
    ids = ids.masked_fill(mask == 0, 0)
    types = (torch.arange(T)[None] >= torch.tensor(lengths)[:, None] // 2).long() * mask
    return ids, mask, types


def test_padding_does_not_change_the_real_tokens():
    model = _bert()
    ids, mask, types = _batch()
    full = model(ids, mask, types, with_mlm=True)
    for b, n in enumerate((12, 7, 3)):  # each row alone, without padding
        alone = model(ids[b:b + 1, :n], mask[b:b + 1, :n], types[b:b + 1, :n], with_mlm=True)
        torch.testing.assert_close(full.hidden_states[b, :n], alone.hidden_states[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(full.logits[b], alone.logits[0], atol=1e-5, rtol=1e-5)


def test_attention_is_bidirectional_and_segments_matter():
    model = _bert()
    ids, _, types = _batch(lengths=(12, 12, 12))
    h = model(ids).hidden_states
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 50  # the last token changes every position's state
    assert (model(changed).hidden_states[:, 0] - h[:, 0]).abs().max() > 1e-4
    assert (model(ids, token_type_ids=types).hidden_states - h).abs().max() > 1e-4


def test_mlm_loss_is_only_on_selected_positions_and_tied():
    model = _bert()
    ids, mask, _ = _batch()
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 5] = 7, 9
    out = model(ids, mask, mlm_labels=labels)
    full = model(ids, mask, with_mlm=True).mlm_logits  # (B, T, V)
    expected = torch.nn.functional.cross_entropy(torch.stack([full[0, 2], full[1, 5]]), torch.tensor([7, 9]))
    torch.testing.assert_close(out.mlm_loss, expected)
    assert out.mlm_logits.shape == (2, 50)
    out.loss.backward()  # the decoder is the embedding: its gradient reaches the tied matrix
    assert model.embeddings.tok_emb.weight.grad is not None
    assert model.mlm_bias.grad.abs().sum() > 0


def test_classification_heads_and_losses_sum():
    model = _bert(pooling="mean")
    ids, mask, types = _batch()
    out = model(ids, mask, types, labels=torch.tensor([0, 1, 2]), next_sentence_label=torch.tensor([0, 1, 0]),
                token_labels=torch.where(mask.bool(), ids % 3, -100))
    assert out.logits.shape == (3, 3) and out.token_logits.shape == (3, 12, 3) and out.nsp_logits.shape == (3, 2)
    torch.testing.assert_close(out.pooled, mean_pool(out.hidden_states, mask))
    torch.testing.assert_close(out.loss, out.nsp_loss + out.cls_loss)
    emb = model.embed(ids, mask)
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(3))


def test_pre_norm_variant_and_save_load_round_trip(tmp_path):
    model = _bert(norm_position="pre", positions="rope")
    ids, mask, types = _batch()
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path)
    assert isinstance(loaded, Bert)
    torch.testing.assert_close(loaded(ids, mask, types).logits, model(ids, mask, types).logits)


def test_relative_positions_variant_round_trips_and_is_order_aware(tmp_path):
    torch.manual_seed(0)
    model = _bert(positions="relative").eval()
    ids, mask, types = _batch()
    model.save_pretrained(tmp_path)
    torch.testing.assert_close(from_pretrained(tmp_path)(ids, mask, types).logits, model(ids, mask, types).logits)
    flipped = model(ids.flip(1), mask.flip(1), types.flip(1)).hidden_states.flip(1)
    assert not torch.allclose(flipped, model(ids, mask, types).hidden_states, atol=1e-4)


def test_family_rules_are_one_line_config_errors():
    for bad in (dict(mixer="ssm"), dict(moe_experts=2), dict(activation="swiglu")):
        with pytest.raises(ConfigError, match="bert"):
            ModelConfig.from_mapping(dict(family="bert", vocab_size=10, **bad))


# ---------------------------------------------------------------------------------- HF parity

def _hf_config(**extra):
    cfg = dict(vocab_size=60, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
               max_position_embeddings=24, type_vocab_size=2, hidden_act="gelu", hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0)
    return transformers.BertConfig(**{**cfg, **extra})


def _compare(ours: Bert, hf, ids, mask, types):
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        mine = ours(ids, mask, types, with_mlm=True)
    real = mask.bool()
    # logits within 1e-4 (max abs) at every real token, MLM and NSP
    assert (mine.mlm_logits[real] - theirs.prediction_logits[real]).abs().max() < 1e-4
    assert (mine.nsp_logits - theirs.seq_relationship_logits).abs().max() < 1e-4
    assert (mine.hidden_states[real] - theirs.hidden_states[-1][real]).abs().max() < 1e-4


@pytest.mark.parametrize("padded", [False, True])
def test_import_of_a_transformers_bert_gives_identical_logits(tmp_path, padded):
    torch.manual_seed(1)
    hf = transformers.BertForPreTraining(_hf_config()).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours, missing = load_bert(tmp_path / "hf")
    assert missing == []
    ids, mask, types = _batch(V=60, T=16, lengths=(16, 9, 4) if padded else (16, 16, 16))
    _compare(ours, hf, ids, mask, types)


@pytest.mark.parametrize("padded", [False, True])
def test_export_loads_in_transformers_with_identical_logits(tmp_path, padded):
    model = _bert(vocab_size=60, d_model=48, d_ff=96, block_size=24)
    with torch.no_grad():  # non-trivial norms and biases, so a swapped tensor cannot pass
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    save_bert(model, tmp_path / "hf")
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    ids, mask, types = _batch(V=60, T=16, lengths=(16, 9, 4) if padded else (16, 16, 16))
    _compare(model, hf, ids, mask, types)
    # BertModel reads the same folder (prefix stripped) with the same pooler output
    base = transformers.BertModel.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        pooled = base(input_ids=ids, attention_mask=mask, token_type_ids=types).pooler_output
    assert (pooled - model(ids, mask, types).pooled).abs().max() < 1e-4


def test_bertmodel_folder_legacy_names_and_pytorch_bin(tmp_path):
    torch.manual_seed(2)
    hf = transformers.BertModel(_hf_config()).eval()
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in hf.state_dict().items()}
    (tmp_path / "hf").mkdir()
    torch.save(state, tmp_path / "hf" / "pytorch_model.bin")
    hf.config.to_json_file(tmp_path / "hf" / "config.json")
    ours, missing = load_bert(tmp_path / "hf")
    assert "mlm_bias" in missing and "nsp_head.weight" in missing and "pooler.weight" not in missing
    ids, mask, types = _batch(V=60, T=16, lengths=(16, 9, 4))
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        mine = ours(ids, mask, types)
    assert (mine.hidden_states[mask.bool()] - theirs.last_hidden_state[mask.bool()]).abs().max() < 1e-4
    assert (mine.pooled - theirs.pooler_output).abs().max() < 1e-4


def test_bad_bert_folders_give_one_line_errors(tmp_path):
    with pytest.raises(CheckpointError, match="norm_position='pre'"):
        save_bert(_bert(norm_position="pre"), tmp_path / "x")
    save_bert(_bert(), tmp_path / "ok")
    cfg = json.loads((tmp_path / "ok" / "config.json").read_text())
    (tmp_path / "ok" / "config.json").write_text(json.dumps({**cfg, "hidden_act": "silu"}))
    with pytest.raises(CheckpointError, match="silu"):
        load_bert(tmp_path / "ok")
    (tmp_path / "ok" / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="not bert"):
        load_bert(tmp_path / "ok")
    (tmp_path / "ok" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "ok" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_bert(tmp_path / "ok")
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_bert(tmp_path / "missing")
