import pytest

from attnlab.core.errors import ConfigError
from attnlab.core.schema import apply_overrides, from_dict, parse_override
from attnlab.models.config import ModelConfig
from attnlab.training.config import TrainConfig
from attnlab.training.runs import load_train_config


def test_parse_override_reads_yaml_scalars():
    assert parse_override("n_layer=6") == ("n_layer", 6)
    assert parse_override("lr=3e-4") == ("lr", "3e-4")  # YAML 1.1 quirk; coerced by the schema
    assert parse_override("compile=true") == ("compile", True)
    assert parse_override("data=a=b.txt") == ("data", "a=b.txt")
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("n_layer")


def test_overrides_bare_and_dotted_keys():
    cfg = load_train_config(None, ["n_layer=6", "model.d_model=96", "lr=3e-4", "max_iters=2e3"])
    assert cfg.model.n_layer == 6 and cfg.model.d_model == 96
    assert cfg.lr == pytest.approx(3e-4) and isinstance(cfg.lr, float)
    assert cfg.max_iters == 2000 and isinstance(cfg.max_iters, int)


@pytest.mark.parametrize(
    "override, message",
    [
        ("n_layr=3", "unknown config key 'n_layr'; did you mean 'n_layer'"),
        ("lerning_rate=1", "unknown config key 'lerning_rate'"),
        ("model.n_headz=3", "unknown config key 'model.n_headz'; did you mean 'model.n_head'"),
        ("n_layer=four", "'model.n_layer' must be int, got 'four'"),
        ("max_iters=1.5", "'max_iters' must be int"),
        ("compile=maybe", "'compile' must be bool"),
        ("positions=rotary", "'model.positions' must be one of"),
        ("n_head=3", "n_head=3 does not divide model.d_model=128"),
        ("n_kv_head=3", "n_kv_head=3 must be >= 1 and divide"),
        ("dropout=1.5", "dropout must be in [0, 1)"),
        ("batch_size=0", "'batch_size' must be >= 1"),
        ("min_lr=1", "min_lr <= lr"),
        ("name=a/b", "plain folder name"),
    ],
)
def test_bad_overrides_give_one_line_errors(override, message):
    with pytest.raises(ConfigError) as e:
        load_train_config(None, [override])
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_nested_section_from_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("max_iters: 7\nmodel:\n  n_layer: 3\n  positions: rope\n")
    cfg = load_train_config(p)
    assert cfg.max_iters == 7 and cfg.model.n_layer == 3 and cfg.model.positions == "rope"
    p.write_text("model:\n  n_layer: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot parse config"):
        load_train_config(p)
    p.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_train_config(p)
    with pytest.raises(ConfigError, match="config file not found"):
        load_train_config(tmp_path / "missing.yaml")
    p.write_text("model: 3\n")
    with pytest.raises(ConfigError, match="'model' must be a mapping"):
        load_train_config(p)


def test_optional_fields_accept_null():
    cfg = from_dict(ModelConfig, {"n_kv_head": None, "d_ff": 64})
    assert cfg.n_kv_head is None and cfg.d_ff == 64
    data = apply_overrides(TrainConfig, {}, ["lr_decay_iters=null"])
    assert from_dict(TrainConfig, data).lr_decay_iters is None
