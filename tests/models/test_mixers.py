"""Token mixers inside the GPT: attention, latent attention (MLA), selective SSM, and hybrids."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.core.errors import ConfigError
from attnlab.generation import SamplingConfig, generate
from attnlab.models import GPTConfig, ModelConfig, build_model, from_pretrained
from attnlab.nn.attention import KVCache, MultiHeadAttention
from attnlab.nn.attention.latent import LatentKVCache, MultiHeadLatentAttention
from attnlab.nn.ssm import SelectiveSSM, SSMState

CASES = [("attention", "rope"), ("latent", "learned"), ("latent", "alibi"), ("ssm", "none"), ("hybrid", "rope"),
         ("hybrid", "alibi")]


def _model(mixer: str, positions: str, **extra):
    torch.manual_seed(0)
    cfg = dict(vocab_size=20, block_size=24, n_layer=4, n_head=4, d_model=32, mixer=mixer, positions=positions)
    return build_model(GPTConfig(**{**cfg, **extra})).eval()


def test_layer_kinds_and_caches():
    m = _model("hybrid", "rope", hybrid_attention_every=2)
    kinds = [type(b.mixer) for b in m.blocks]
    assert kinds == [SelectiveSSM, MultiHeadAttention, SelectiveSSM, MultiHeadAttention]
    assert [type(c) for c in m.new_cache(2)] == [SSMState, KVCache, SSMState, KVCache]
    latent = _model("latent", "none", d_latent=16, d_rope=4)
    assert all(isinstance(b.mixer, MultiHeadLatentAttention) for b in latent.blocks)
    cache = latent.new_cache(2)
    assert all(isinstance(c, LatentKVCache) and c.num_elements() == 16 + 4 for c in cache)


@pytest.mark.parametrize("mixer, positions", CASES)
def test_cached_decoding_equals_full_forward(mixer, positions):
    m = _model(mixer, positions)
    idx = torch.randint(0, 20, (2, 24))
    full = m(idx).logits
    cache = m.new_cache(2)
    steps = [m(idx[:, :9], cache=cache).logits]
    steps += [m(idx[:, t : t + 1], cache=cache).logits for t in range(9, 24)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mixer, positions", CASES)
def test_generation_with_and_without_cache_is_identical(mixer, positions):
    m = _model(mixer, positions)
    prompt = torch.randint(0, 20, (2, 6))
    cfg = dict(max_new_tokens=30, temperature=1.0, top_k=10, seed=5)  # runs past block_size (24)
    assert torch.equal(generate(m, prompt, SamplingConfig(**cfg, use_cache=True)),
                       generate(m, prompt, SamplingConfig(**cfg, use_cache=False)))


@pytest.mark.parametrize("mixer, positions", CASES)
def test_causal_and_save_load(mixer, positions, tmp_path):
    m = _model(mixer, positions)
    a = torch.randint(0, 20, (1, 16))
    b = a.clone()
    b[0, 10] = (b[0, 10] + 1) % 20
    torch.testing.assert_close(m(a).logits[:, :10], m(b).logits[:, :10])
    assert not torch.allclose(m(a).logits[:, 10:], m(b).logits[:, 10:])
    m.save_pretrained(tmp_path / "m")
    assert torch.equal(from_pretrained(tmp_path / "m")(a).logits, m(a).logits)


def test_ssm_keeps_its_own_init_inside_the_gpt():
    m = _model("ssm", "none")
    ssm = m.blocks[0].mixer
    torch.testing.assert_close(ssm.A[0], -torch.arange(1, ssm.d_state + 1, dtype=torch.float32))
    assert torch.all(ssm.D == 1)
    dt = torch.nn.functional.softplus(ssm.dt_proj.bias)
    assert dt.min() >= ssm.dt_min * 0.99 and dt.max() <= ssm.dt_max * 1.01


def test_ssm_parameters_flagged_are_not_weight_decayed():
    from attnlab.training.config import TrainConfig
    from attnlab.training.trainer import make_optimizer

    m = _model("ssm", "none")
    opt = make_optimizer(m, TrainConfig())
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert id(m.blocks[0].mixer.A_log) not in decayed
    assert id(m.blocks[0].mixer.in_proj.weight) in decayed


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(mixer="latent", positions="rope"), "its own decoupled RoPE"),
        (dict(mixer="latent", positions="relative"), "takes no positions=relative"),
        (dict(mixer="ssm", positions="alibi"), "mixer=ssm has none"),
        (dict(mixer="ssm", positions="relative"), "mixer=ssm has none"),
        (dict(mixer="latent", positions="none", d_rope=3), "d_rope must be even"),
        (dict(mixer="hybrid", hybrid_attention_every=0), "hybrid_attention_every"),
        (dict(mixer="mamba"), "'model.mixer' must be one of"),
    ],
)
def test_mixer_config_validation(changes, message):
    from attnlab.core.schema import from_dict

    with pytest.raises(ConfigError, match=message):
        from_dict(ModelConfig, dict(vocab_size=20, n_head=4, d_model=32, **changes), prefix="model.")


@pytest.mark.parametrize("mixer, positions", [("latent", "none"), ("hybrid", "rope"), ("ssm", "none")])
def test_trainer_runs_every_mixer(mixer, positions, tmp_path):
    from attnlab.training.trainer import Trainer
    from tests.helpers import tiny_config, write_corpus

    corpus = write_corpus(tmp_path / "c.txt")
    cfg = tiny_config(corpus, tmp_path / "runs", name=mixer, mixer=mixer, positions=positions, max_iters=60,
                      eval_interval=60, lr=3e-3, min_lr=3e-4, n_head=2)
    trainer = Trainer(cfg)
    uniform = math.log(trainer.tokenizer.vocab_size)
    result = trainer.train()
    assert result.val_loss < uniform - 0.5, (result.val_loss, uniform)  # well below guessing


def test_latent_attention_with_the_tiled_backend_is_refused_not_substituted():

    cfg = GPTConfig(vocab_size=20, d_model=32, n_head=4, mixer="latent", positions="none", attn_backend="tiled")
    with pytest.raises(ConfigError, match=r"^model.attn_backend=tiled: the tiled route does not compute multi-head "
                                          r"latent attention \(mixer=latent\); routes that do: eager, sdpa$"):
        cfg.validate()
    with pytest.raises(ValueError, match="unknown attention backend 'tiled'"):
        MultiHeadLatentAttention(32, 4, d_latent=16, backend="tiled")
