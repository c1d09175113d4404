"""Tests for attnlab.models: ModelConfig validation, the GPT, and save/load in the HF layout."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import attnlab.models
from attnlab.core.errors import CheckpointError, ConfigError
from attnlab.core.manifest import write_manifest
from attnlab.core.schema import from_dict
from attnlab.models import ModelConfig, build_model
from attnlab.models.base import CONFIG_NAME, WEIGHTS_NAME, read_config
from attnlab.models.gpt import GPT
from tests.helpers import with_patterns

POSITIONS = ["learned", "sinusoidal", "rope", "alibi", "relative", "none"]
BACKENDS = ["eager", "sdpa"]
VOCAB = 37


def make_gpt(seed: int = 0, **overrides) -> GPT:
    cfg = dict(vocab_size=VOCAB, block_size=16, n_layer=2, n_head=4, d_model=32)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = build_model(from_dict(ModelConfig, cfg))
    assert isinstance(model, GPT)
    return model.eval()


def tokens(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------ forward pass


@pytest.mark.parametrize("positions", POSITIONS)
def test_output_shapes(positions):
    model = make_gpt(positions=positions)
    idx = tokens(3, 10)
    out = model(idx)
    assert out.logits.shape == (3, 10, VOCAB)
    assert out.loss is None
    last = model(idx, last_only=True)
    assert last.logits.shape == (3, 1, VOCAB)
    assert torch.allclose(last.logits[:, 0], out.logits[:, -1], atol=1e-5)
    _, maps = with_patterns(model, idx)
    assert len(maps) == 2 and maps[0].shape == (3, 4, 10, 10)


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_loss_equals_cross_entropy(positions):
    model = make_gpt(positions=positions)
    idx, targets = tokens(2, 9, seed=1), tokens(2, 9, seed=2)
    out = model(idx, targets=targets)
    expected = F.cross_entropy(out.logits.reshape(-1, VOCAB), targets.reshape(-1))
    assert out.loss.shape == ()
    assert torch.allclose(out.loss, expected, atol=1e-6)
    # an untrained model is close to uniform: loss ~ log V
    assert abs(out.loss.item() - math.log(VOCAB)) < 0.5
    # -100 targets are ignored
    t2 = targets.clone()
    t2[:, :4] = -100
    out2 = model(idx, targets=t2)
    expected2 = F.cross_entropy(out.logits[:, 4:].reshape(-1, VOCAB), targets[:, 4:].reshape(-1))
    assert torch.allclose(out2.loss, expected2, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("positions", POSITIONS)
def test_causality(positions, backend):
    model = make_gpt(positions=positions, attn_backend=backend)
    idx = tokens(2, 12)
    base = model(idx).logits
    for t in (0, 5, 11):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1) % VOCAB
        logits = model(changed).logits
        assert torch.allclose(logits[:, :t], base[:, :t], atol=1e-6), t
        assert not torch.allclose(logits[:, t:], base[:, t:], atol=1e-4), t


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("n_kv_head", [None, 2])
def test_eager_and_sdpa_models_agree(positions, n_kv_head):
    a = make_gpt(positions=positions, n_kv_head=n_kv_head, attn_backend="eager")
    b = make_gpt(positions=positions, n_kv_head=n_kv_head, attn_backend="sdpa")
    b.load_state_dict(a.state_dict())
    idx, targets = tokens(2, 11), tokens(2, 11, seed=1)
    la, lb = a(idx, targets=targets), b(idx, targets=targets)
    assert torch.allclose(la.logits, lb.logits, atol=1e-5)
    la.loss.backward()
    lb.loss.backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-5), name


@pytest.mark.parametrize("positions", POSITIONS)
def test_one_layer_sees_order_only_with_positions(positions):
    """Swap two tokens: in one causal layer every later position sees the same *set* of tokens,
    so only a positional scheme can tell the two orders apart ('none' gives a bag)."""
    model = make_gpt(positions=positions, n_layer=1, init_std=0.2)
    idx = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    swapped = torch.tensor([[6, 2, 3, 4, 5, 1, 7, 8]])
    a, b = model(idx).logits[0], model(swapped).logits[0]
    assert (a[0] - b[0]).abs().max() > 1e-3  # position 0 sees a different token
    if positions == "none":
        assert torch.allclose(a[6:], b[6:], atol=1e-5)
    else:
        assert (a[6:] - b[6:]).abs().max() > 1e-3


# --------------------------------------------------------------------------- weights / init


def test_tied_weights():
    model = make_gpt()
    assert model.lm_head.weight is model.tok_emb.weight
    n_tied = model.num_parameters()
    untied = make_gpt(tie_embeddings=False)
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert untied.num_parameters() == n_tied + VOCAB * 32
    # gradient of a tied model flows into the one shared tensor from both uses
    idx = tokens(2, 6)
    model(idx, targets=tokens(2, 6, 1)).loss.backward()
    assert model.tok_emb.weight.grad is model.lm_head.weight.grad


def test_untied_head_is_independent():
    model = make_gpt(tie_embeddings=False)
    idx = tokens(1, 5)
    before = model(idx).logits
    with torch.no_grad():
        model.lm_head.weight.zero_()
    assert torch.equal(model(idx).logits, torch.zeros_like(before))
    assert model.tok_emb.weight.abs().sum() > 0


@pytest.mark.parametrize("n_layer", [1, 2, 8])
def test_residual_projection_init_scaled(n_layer):
    model = make_gpt(n_layer=n_layer, d_model=64, n_head=4, init_std=0.02)
    target = 0.02 / math.sqrt(2 * n_layer)
    out_w = torch.cat([b.mixer.out_proj.weight.flatten() for b in model.blocks])
    fc_w = torch.cat([b.ffn.fc_out.weight.flatten() for b in model.blocks])
    assert out_w.std().item() == pytest.approx(target, rel=0.1)
    assert fc_w.std().item() == pytest.approx(target, rel=0.1)
    qkv = torch.cat([b.mixer.qkv_proj.weight.flatten() for b in model.blocks])
    assert qkv.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.1)
    for b in model.blocks:
        assert torch.equal(b.mixer.qkv_proj.bias, torch.zeros_like(b.mixer.qkv_proj.bias))


def test_init_std_config_is_honoured():
    model = make_gpt(init_std=0.1, n_layer=2)
    assert model.tok_emb.weight.std().item() == pytest.approx(0.1, rel=0.1)


def test_gpt_needs_vocab_size():
    cfg = from_dict(ModelConfig, dict(block_size=8, n_layer=1, n_head=2, d_model=16))
    with pytest.raises(ValueError, match="vocab_size"):
        GPT(cfg)


@pytest.mark.parametrize("norm_position,identity", [("pre", False), ("post", True)])
def test_final_norm_only_for_pre_norm(norm_position, identity):
    model = make_gpt(norm_position=norm_position)
    assert isinstance(model.norm_f, torch.nn.Identity) == identity


def test_learned_positions_beyond_block_size_raise():
    model = make_gpt(positions="learned", block_size=8)
    model(tokens(1, 8))
    with pytest.raises(ValueError, match="exceeds the context"):
        model(tokens(1, 9))
    cache = model.new_cache(1, max_len=16)
    model(tokens(1, 6), cache=cache)
    with pytest.raises(ValueError, match="exceeds the context"):
        model(tokens(1, 3), cache=cache)


@pytest.mark.parametrize("positions", ["sinusoidal", "rope", "alibi", "none"])
def test_relative_and_fixed_positions_run_beyond_block_size(positions):
    model = make_gpt(positions=positions, block_size=8)
    out = model(tokens(1, 12)).logits
    assert out.shape == (1, 12, VOCAB) and torch.isfinite(out).all()


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_cached_forward_equals_full_forward(positions, backend):
    model = make_gpt(positions=positions, attn_backend=backend, n_kv_head=2)
    idx = tokens(2, 10)
    full = model(idx).logits
    cache = model.new_cache(2)
    assert len(cache) == 2 and cache[0].k.shape == (2, 2, 16, 8)
    parts = [model(idx[:, :4], cache=cache).logits, model(idx[:, 4:7], cache=cache).logits]
    parts += [model(idx[:, t : t + 1], cache=cache).logits for t in range(7, 10)]
    assert cache[0].length == 10
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)


# --------------------------------------------------------------------------- save / load

SAVE_CONFIGS = {
    "learned": dict(positions="learned"),
    "rope-gqa-swiglu-rmsnorm": dict(positions="rope", n_kv_head=2, activation="swiglu", norm="rmsnorm", bias=False),
    "alibi-mqa": dict(positions="alibi", n_kv_head=1, norm_position="post"),
    "sinusoidal-untied": dict(positions="sinusoidal", tie_embeddings=False, activation="relu"),
    "none-eager": dict(positions="none", attn_backend="eager", d_ff=40),
}


@pytest.mark.parametrize("name", list(SAVE_CONFIGS))
def test_save_and_load_round_trip(tmp_path, name):
    model = make_gpt(**SAVE_CONFIGS[name])
    out_dir = model.save_pretrained(tmp_path / "m")
    assert (out_dir / CONFIG_NAME).is_file() and (out_dir / WEIGHTS_NAME).is_file()
    idx = tokens(2, 10)
    expected = model(idx).logits
    for loader in (GPT.from_pretrained, attnlab.models.from_pretrained):
        loaded = loader(out_dir)
        assert isinstance(loaded, GPT)
        assert not loaded.training
        assert loaded.config == model.config
        assert torch.equal(loaded(idx).logits, expected)
        tied = loaded.lm_head.weight is loaded.tok_emb.weight
        assert tied == model.config.tie_embeddings
        for (k, v), (k2, v2) in zip(model.state_dict().items(), loaded.state_dict().items()):
            assert k == k2 and torch.equal(v, v2)
    # no temporary files left behind by the atomic writes
    assert sorted(p.name for p in out_dir.iterdir()) == sorted([CONFIG_NAME, WEIGHTS_NAME, "manifest.json"])


def test_config_json_contains_the_config(tmp_path):
    model = make_gpt(positions="rope", n_kv_head=2, activation="swiglu")
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / CONFIG_NAME).read_text())
    assert data["config_version"] == 3
    assert "attnlab_version" in data
    for key, value in vars(model.config).items():
        assert data[key] == value, key
    # the GPT's own options only: nothing of another family
    assert set(data) - {"config_version", "attnlab_version"} == set(vars(model.config))
    assert not {"cnn_width", "n_segments", "patch_size", "n_classes"} & set(data)
    assert data["vocab_size"] == VOCAB and data["n_kv_head"] == 2 and data["positions"] == "rope"
    assert read_config(tmp_path) == model.config
    assert read_config(tmp_path / CONFIG_NAME) == model.config


@pytest.fixture
def saved(tmp_path) -> Path:
    make_gpt(d_model=32).save_pretrained(tmp_path)
    return tmp_path


def _edit_config(folder: Path, resign: bool = True, **changes) -> None:
    """Edit config.json; ``resign``: rewrite the manifest too (as someone who means it would), so the
    checks behind the manifest are what is tested."""
    data = json.loads((folder / CONFIG_NAME).read_text())
    data.update(changes)
    (folder / CONFIG_NAME).write_text(json.dumps(data))
    if resign:
        write_manifest(folder, names=(CONFIG_NAME, WEIGHTS_NAME))


def test_the_same_weights_give_the_same_file_in_every_process(tmp_path):
    """safetensors writes its metadata in hash-map order (a new order for each file it writes, from a new seed per
    process): a tied GPT's file has two keys (the format and the tied weight) plus attnlab's version, so one model
    saved by two processes, or twice by one, gave two different files and manifest hashes; with the keys sorted they
    agree byte for byte, and load."""
    import os
    import subprocess
    import sys

    shape = dict(vocab_size=11, block_size=8, n_layer=1, n_head=2, d_model=8)
    code = ("import sys, torch; from attnlab.core.schema import from_dict; from attnlab.models import ModelConfig, "
            f"build_model; torch.manual_seed(0); build_model(from_dict(ModelConfig, {shape!r}))"
            ".save_pretrained(sys.argv[1])")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "other")], check=True,
                   env={**os.environ, "PYTHONHASHSEED": "1"})
    files = [(tmp_path / "other" / WEIGHTS_NAME).read_bytes()]
    torch.manual_seed(0)
    model = build_model(from_dict(ModelConfig, shape))
    for k in range(4):  # and 4 files written here: 6 orders of 3 keys in 5 files all agree by chance with odds 1/1296
        model.save_pretrained(tmp_path / str(k))
        files.append((tmp_path / str(k) / WEIGHTS_NAME).read_bytes())
    assert len(set(files)) == 1
    assert files[0].index(b'"__metadata__":{"attnlab_version":') > 0  # sorted
    loaded = attnlab.models.from_pretrained(tmp_path / "other")
    assert loaded.lm_head.weight is loaded.tok_emb.weight


def test_sorting_the_metadata_keeps_the_file_byte_for_byte_when_already_sorted(tmp_path):
    """The rewritten header is the one safetensors itself writes (compact JSON padded with spaces): on a file it
    wrote with a single metadata key, sorting changes no byte."""
    from safetensors.torch import save_file

    from attnlab.models.base import sort_metadata

    file = tmp_path / "w.safetensors"
    save_file({"b.weight": torch.ones(3, 5), "a": torch.zeros(7, dtype=torch.int64)}, str(file),
              metadata={"format": "pt"})
    before = file.read_bytes()
    sort_metadata(file)
    assert file.read_bytes() == before


def test_an_edited_config_is_refused_by_the_manifest(saved):
    """A shape-preserving edit (n_head 4 -> 1) would load and compute something else: the hash stops it."""
    _edit_config(saved, resign=False, n_head=1)
    with pytest.raises(CheckpointError) as err:
        attnlab.models.from_pretrained(saved)
    _assert_one_line_naming(err, CONFIG_NAME)
    assert "manifest hash" in str(err.value)


def _assert_one_line_naming(err: pytest.ExceptionInfo, filename: str) -> None:
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert filename in msg, msg


@pytest.mark.parametrize("loader", [GPT.from_pretrained, attnlab.models.from_pretrained])
def test_load_rejects_unknown_config_key(saved, loader):
    _edit_config(saved, n_layers=3)
    with pytest.raises(CheckpointError) as err:
        loader(saved)
    _assert_one_line_naming(err, CONFIG_NAME)
    assert "n_layers" in str(err.value)


@pytest.mark.parametrize("loader", [GPT.from_pretrained, attnlab.models.from_pretrained])
def test_load_rejects_newer_config_version(saved, loader):
    _edit_config(saved, config_version=999)
    with pytest.raises(CheckpointError) as err:
        loader(saved)
    _assert_one_line_naming(err, CONFIG_NAME)
    assert "999" in str(err.value)


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.001])
def test_load_rejects_truncated_weights(saved, keep):
    weights = saved / WEIGHTS_NAME
    data = weights.read_bytes()
    weights.write_bytes(data[: max(1, int(len(data) * keep))])
    with pytest.raises(CheckpointError) as err:
        GPT.from_pretrained(saved)
    _assert_one_line_naming(err, WEIGHTS_NAME)


def test_load_rejects_weights_not_matching_config(saved):
    _edit_config(saved, d_model=64)
    with pytest.raises(CheckpointError) as err:
        attnlab.models.from_pretrained(saved)
    _assert_one_line_naming(err, WEIGHTS_NAME)
    assert "size mismatch" in str(err.value)


def test_load_rejects_weights_with_missing_layer(saved):
    _edit_config(saved, n_layer=3)
    with pytest.raises(CheckpointError) as err:
        GPT.from_pretrained(saved)
    _assert_one_line_naming(err, WEIGHTS_NAME)
    assert "blocks.2" in str(err.value)


def test_load_rejects_missing_files(tmp_path, saved):
    with pytest.raises(CheckpointError, match=CONFIG_NAME):
        GPT.from_pretrained(tmp_path / "nowhere")
    (saved / WEIGHTS_NAME).unlink()
    with pytest.raises(CheckpointError, match=WEIGHTS_NAME):
        GPT.from_pretrained(saved)


def test_load_rejects_invalid_json(saved):
    (saved / CONFIG_NAME).write_text("{not json")
    with pytest.raises(CheckpointError) as err:
        GPT.from_pretrained(saved)
    _assert_one_line_naming(err, CONFIG_NAME)


def test_load_rejects_invalid_value(saved):
    _edit_config(saved, dropout=1.5)
    with pytest.raises(CheckpointError) as err:
        GPT.from_pretrained(saved)
    _assert_one_line_naming(err, CONFIG_NAME)


@pytest.mark.parametrize("loader", [GPT.from_pretrained, attnlab.models.from_pretrained])
def test_load_rejects_config_without_vocab_size(saved, loader):
    _edit_config(saved, vocab_size=None)
    with pytest.raises(CheckpointError) as err:
        loader(saved)
    _assert_one_line_naming(err, CONFIG_NAME)


# -------------------------------------------------------------------------- config validation

BASE = dict(vocab_size=VOCAB, block_size=16, n_layer=1, n_head=4, d_model=32)


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(n_head=5), "n_head"),
        (dict(n_head=3, d_model=32), "n_head"),
        (dict(n_kv_head=3), "n_kv_head"),
        (dict(n_kv_head=0), "n_kv_head"),
        (dict(dropout=1.5), "dropout"),
        (dict(dropout=-0.1), "dropout"),
        (dict(dropout=1.0), "dropout"),
        (dict(family="llama"), "family"),
        (dict(positions="absolute"), "positions"),
        (dict(activation="tanh"), "activation"),
        (dict(attn_backend="flash"), "attn_backend"),
        (dict(n_layer=0), "n_layer"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(d_model=36, n_head=4, positions="rope"), "RoPE"),
        (dict(n_layers=2), "n_layer"),
        (dict(d_model="big"), "d_model"),
        (dict(norm_eps=0.0), "norm_eps"),
        (dict(logit_softcap=0.0), "logit_softcap"),
        (dict(logit_softcap=-5.0), "logit_softcap"),
        (dict(mixer="ssm", positions="none", qk_norm=True), "qk_norm"),  # no attention to normalise
        (dict(mixer="latent", positions="none", qk_norm=True), "qk_norm"),
    ],
)
def test_model_config_validation(changes, match):
    with pytest.raises(ConfigError, match=match) as err:
        from_dict(ModelConfig, {**BASE, **changes})
    assert "\n" not in str(err.value)


def test_model_config_valid_variants():
    for changes in (dict(n_kv_head=1), dict(n_kv_head=2), dict(dropout=0.0), dict(dropout=0.99)):
        cfg = from_dict(ModelConfig, {**BASE, **changes})
        assert cfg.head_dim == 8
    cfg = from_dict(ModelConfig, {**BASE, "dropout": "0.1", "n_layer": 2.0})
    assert cfg.dropout == 0.1 and cfg.n_layer == 2 and isinstance(cfg.n_layer, int)



# ------------------------------------------------------------------- speed-run options of the GPT


def test_logit_softcap_bounds_the_logits_as_cap_tanh_z_over_cap():
    capped, plain = make_gpt(logit_softcap=2.0), make_gpt()  # same seed: same weights
    idx = tokens(2, 9)
    with torch.no_grad():  # large logits, so the cap is felt
        for model in (capped, plain):
            model.lm_head.weight.mul_(5.0)
    z = plain(idx).logits
    out = capped(idx, targets=idx)
    assert torch.allclose(out.logits, 2.0 * torch.tanh(z / 2.0), atol=1e-5)
    assert out.logits.abs().max() < 2.0 < z.abs().max()
    assert torch.allclose(out.loss, F.cross_entropy(out.logits.view(-1, VOCAB), idx.view(-1)))


def test_a_capped_model_decodes_with_the_cache_as_its_full_forward():
    model = make_gpt(logit_softcap=3.0, positions="rope", qk_norm=True, activation="relu2")
    idx = tokens(1, 8)
    full = model(idx).logits
    cache = model.new_cache(1)
    steps = [model(idx[:, t:t + 1], cache=cache).logits for t in range(8)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_relu2_is_relu_squared_in_the_mlp():
    model = make_gpt(activation="relu2")
    ffn = model.blocks[0].ffn
    x = torch.randn(3, 32)
    assert torch.allclose(ffn(x), ffn.fc_out(F.relu(ffn.fc_in(x)) ** 2), atol=1e-6)
