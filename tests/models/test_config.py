"""Per-family configs: each family holds its own options only, refuses another family's (and its own
options that the chosen blocks do not use) in one line, and still reads config files of the flat schema."""

from __future__ import annotations

import dataclasses
import json

import pytest

from attnlab.cli import main
from attnlab.core.errors import ConfigError
from attnlab.core.legacy import FLAT_DEFAULTS as LEGACY_DEFAULTS
from attnlab.models import (
    BertConfig,
    CaptionerConfig,
    CNNConfig,
    DINOConfig,
    EncoderConfig,
    GPTConfig,
    MAEConfig,
    MLPConfig,
    ModelConfig,
    RecurrentConfig,
    Seq2SeqConfig,
    ViTConfig,
)
from attnlab.models.base import read_config

# options added after the flat version-1 schema (the speed run's QK-norm and logit soft-cap)
ADDED_SINCE_THE_FLAT_SCHEMA = {"qk_norm", "logit_softcap", "n_targets", "mask_ratio", "decoder_layers",
                               "decoder_d_model", "decoder_n_head", "norm_pix_loss", "engram_layers", "engram_order",
                               "engram_heads", "engram_table_size", "engram_dim", "engram_conv", "head_type"}

FAMILIES = {"gpt": GPTConfig, "bert": BertConfig, "seq2seq": Seq2SeqConfig, "vit": ViTConfig, "cnn": CNNConfig,
            "encoder": EncoderConfig, "mae": MAEConfig}


def fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_each_family_has_its_own_options_and_the_flat_schema_is_their_union():
    # families added after the flat schema (no version-1 file holds them) own their defaults
    assert ModelConfig.families == {**FAMILIES, "recurrent": RecurrentConfig, "captioner": CaptionerConfig,
                                    "dino": DINOConfig, "mlp": MLPConfig}
    assert fields(RecurrentConfig) - set(LEGACY_DEFAULTS) == {"cell", "bidirectional"}
    assert fields(CaptionerConfig) - set(LEGACY_DEFAULTS) == {"qk_norm"}
    assert fields(DINOConfig) - set(LEGACY_DEFAULTS) >= {"out_dim", "teacher_temp", "local_size", "teacher_momentum"}
    # nothing lost; added since: only the options listed (a version-1 file never holds them: their defaults)
    assert set().union(*map(fields, FAMILIES.values())) == set(LEGACY_DEFAULTS) | ADDED_SINCE_THE_FLAT_SCHEMA
    assert not fields(CNNConfig) & {"mixer", "moe_experts", "residual", "n_head", "d_model", "vocab_size"}
    assert not fields(ViTConfig) & {"block_size", "vocab_size", "rope_theta", "mixer"}
    assert fields(GPTConfig) >= {"mixer", "moe_experts", "residual", "vocab_size"}
    assert not fields(BertConfig) & {"mixer", "moe_experts", "residual", "cnn_width"}
    # every family's defaults are the flat schema's, so a file of the old schema means the same thing
    for cls in FAMILIES.values():
        for f in dataclasses.fields(cls):
            if f.name != "family" and f.name not in ADDED_SINCE_THE_FLAT_SCHEMA:
                assert f.default == LEGACY_DEFAULTS[f.name], (cls.__name__, f.name)


@pytest.mark.parametrize(("family", "key", "value"), [
    ("cnn", "mixer", "ssm"), ("cnn", "moe_experts", 4), ("cnn", "residual", "hyper"), ("vit", "vocab_size", 9),
    ("bert", "moe_experts", 2), ("seq2seq", "residual", "mhc"), ("encoder", "tie_embeddings", False),
    ("gpt", "n_classes", 3), ("gpt", "cnn_width", 8),
])
def test_an_option_of_another_family_is_refused_in_one_line(family, key, value):
    with pytest.raises(ConfigError, match=rf"^model\.{key} is not an option of family {family}$"):
        ModelConfig.from_mapping({"family": family, key: value})


def test_another_familys_option_is_refused_at_any_value_but_a_dump_of_the_flat_schema_drops_it():
    """A new file or command line that names another family's option is refused even at the flat schema's
    default (``model.patch_size=4`` on a GPT trained without it); a file attnlab wrote (dump) lists them all."""
    section = {"family": "cnn", "mixer": "attention", "moe_experts": 0, "n_classes": 3}
    with pytest.raises(ConfigError, match=r"^model\.mixer is not an option of family cnn$"):
        ModelConfig.from_mapping(section)
    cfg = ModelConfig.from_mapping(section, dump=True)
    assert type(cfg) is CNNConfig and cfg.n_classes == 3


@pytest.mark.parametrize(("options", "key"), [
    (dict(d_latent=None), "d_latent"), (dict(ssm_d_state=16), "ssm_d_state"), (dict(moe_top_k=2), "moe_top_k"),
    (dict(residual_streams=4), "residual_streams"), (dict(rope_theta=10000.0), "rope_theta"),
])
def test_an_unused_option_given_at_its_default_is_refused_but_a_dump_holds_it(options, key):
    with pytest.raises(ConfigError, match=rf"^model\.{key} is not used: "):
        ModelConfig.from_mapping({"family": "gpt", "vocab_size": 10, **options})
    assert ModelConfig.from_mapping({"family": "gpt", "vocab_size": 10, **options}, dump=True) == GPTConfig(
        vocab_size=10)


@pytest.mark.parametrize("override, family_key", [
    ("model.patch_size=4", "model.patch_size is not an option of family gpt"),
    ("model.cnn_width=32", "model.cnn_width is not an option of family gpt"),
    ("model.n_segments=2", "model.n_segments is not an option of family gpt"),
    ("head=regression", "model.head is not an option of family gpt"),
])
def test_the_cli_refuses_another_familys_option_at_its_default(override, family_key, tmp_path, capsys):
    assert main(["train", "quickstart", override, f"out_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err.strip() == f"attnlab: error: {family_key}"
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(("options", "key"), [
    (dict(d_latent=32), "d_latent"), (dict(q_latent=16), "q_latent"), (dict(ssm_d_state=8), "ssm_d_state"),
    (dict(hybrid_attention_every=3), "hybrid_attention_every"), (dict(moe_top_k=1), "moe_top_k"),
    (dict(moe_every=2), "moe_every"), (dict(residual_streams=2), "residual_streams"),
    (dict(rope_theta=500.0), "rope_theta"), (dict(mixer="ssm", positions="none", n_kv_head=2), "n_kv_head"),
])
def test_an_option_the_chosen_blocks_do_not_use_is_refused(options, key):
    with pytest.raises(ConfigError, match=rf"^model\.{key}=.* is not used: "):
        ModelConfig.from_mapping({"family": "gpt", "vocab_size": 10, **options})
    with pytest.raises(ConfigError, match=rf"model\.{key}="):  # the same rule for a config built in Python
        GPTConfig(vocab_size=10, **options).validate()


def test_the_same_options_are_accepted_where_the_blocks_use_them():
    ModelConfig.from_mapping({"family": "gpt", "mixer": "latent", "positions": "none", "d_latent": 32,
                              "rope_theta": 500.0})
    ModelConfig.from_mapping({"family": "gpt", "mixer": "hybrid", "positions": "none", "ssm_d_state": 8,
                              "hybrid_attention_every": 3})
    ModelConfig.from_mapping({"family": "gpt", "moe_experts": 4, "moe_top_k": 1, "moe_every": 2})
    ModelConfig.from_mapping({"family": "gpt", "residual": "mhc", "residual_streams": 2})
    ModelConfig.from_mapping({"family": "encoder", "head": "classification", "n_classes": 3})
    with pytest.raises(ConfigError, match=r"^model\.n_outputs=2 is not used: regression only"):
        ModelConfig.from_mapping({"family": "encoder", "head": "classification", "n_outputs": 2})


def test_an_unknown_family_or_key_gets_a_hint():
    with pytest.raises(ConfigError, match="unknown model family 'vti'; did you mean 'vit'"):
        ModelConfig.from_mapping({"family": "vti"})
    with pytest.raises(ConfigError, match=r"unknown config key 'model\.n_layers'; did you mean 'model\.n_layer'"):
        ModelConfig.from_mapping({"family": "gpt", "n_layers": 2})


def test_the_cli_refuses_the_mixed_up_config_before_any_work(tmp_path, capsys):
    argv = ["train", "cnn-digits", "family=cnn", "mixer=ssm", "moe_experts=4", "residual=hyper",
            f"out_dir={tmp_path}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == "attnlab: error: model.mixer is not an option of family cnn"
    assert not any(tmp_path.iterdir())  # no run folder was started


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_config_json_of_the_flat_schema_still_loads(family, tmp_path):
    """A version-1 file carries every family's options; what the family (or its blocks) never read is
    dropped, whatever its value: that schema ignored it, so the model it trained did not use it."""
    flat = {**LEGACY_DEFAULTS, "family": family, "vocab_size": 11, "n_classes": 3, "moe_top_k": 1,
            "cnn_width": 8, "config_version": 1, "attnlab_version": "0.1.0"}
    if family != "gpt":
        flat["moe_experts"] = 4  # ignored by every family but gpt
    (tmp_path / "config.json").write_text(json.dumps(flat))
    cfg = read_config(tmp_path)
    assert type(cfg) is FAMILIES[family]
    defaults = {f.name: f.default for f in dataclasses.fields(type(cfg))}
    for key in fields(type(cfg)) - {"family"}:
        expected = flat.get(key, defaults[key]) if key not in ("moe_top_k", "n_classes") else getattr(cfg, key)
        assert getattr(cfg, key) == expected, key
    if family == "gpt":
        assert cfg.moe_top_k == 2  # unused without experts: back at its default
    if family == "cnn":
        assert cfg.cnn_width == 8


BROKEN = [("n_layer", 0), ("n_head", 0), ("d_model", -8), ("dropout", 2.0)]


@pytest.mark.parametrize("family", ["gpt", "bert", "seq2seq", "vit", "encoder", "mae", "captioner", "dino"])
@pytest.mark.parametrize("key, value", BROKEN)
def test_a_model_built_in_python_refuses_what_the_cli_refuses(family, key, value):
    """GPT(GPTConfig(n_layer=0)) used to build a model without a block; the constructor now runs the checks
    of ``attnlab train`` (the same one-line ConfigError naming the option) before any weight exists."""
    from attnlab.models.registry import model_class

    config = dataclasses.replace(ModelConfig.for_family(family)(), **{key: value})
    with pytest.raises(ConfigError, match=f"model.{key}"):
        model_class(family)(config)


def test_a_model_refuses_another_familys_config():
    from attnlab.models.gpt import GPT

    with pytest.raises(ConfigError, match="GPT needs a GPTConfig, got BertConfig"):
        GPT(BertConfig(vocab_size=10))


@pytest.mark.parametrize("family", ["gpt", "bert", "seq2seq", "vit", "cnn", "encoder", "mae", "captioner", "dino",
                                    "recurrent", "mlp"])
def test_every_familys_defaults_pass_its_own_checks(family):
    """DINOConfig() used to fail them (local crops of 32 px from 28 px images)."""
    ModelConfig.for_family(family)().validate()
