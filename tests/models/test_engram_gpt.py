"""A GPT with Engram layers (engram_layers): its options are checked in one line, it decodes with the cache as the
full forward computes, it saves and loads to the same logits, its tables are neither decayed nor counted as matmul
FLOPs, and the gpt-engram preset trains, samples, is inspected, and is refused by export in one line."""

from __future__ import annotations

import pytest
import torch

from attnlab.api_generate import batches_exactly
from attnlab.cli import main
from attnlab.core.errors import ConfigError
from attnlab.generation import SamplingConfig, generate
from attnlab.models import GPTConfig, ModelConfig, build_model
from attnlab.models.gpt import GPT
from attnlab.models.registry import from_pretrained
from attnlab.models.size import parameter_estimate
from attnlab.nn.blocks import EngramBlock
from attnlab.nn.hooks import capture
from attnlab.training.config import TrainConfig
from attnlab.training.mfu import active_parameters
from attnlab.training.optim import make_optimizer
from tests.helpers import tiny_overrides, write_corpus

SHAPE = dict(vocab_size=30, block_size=24, n_layer=3, n_head=2, d_model=16, engram_layers="0,2",
             engram_order=3, engram_heads=2, engram_table_size=13, engram_dim=8, engram_conv=3)


def engram_gpt(**changes) -> GPT:
    """A small Engram GPT, every weight random (the Engram convolutions start at zero)."""
    torch.manual_seed(0)
    model = build_model(GPTConfig(**{**SHAPE, **changes})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("changes, said", [
    ({"engram_layers": "3"}, "names layer 3, and the model has layers 0..2"),
    ({"engram_layers": "1,x"}, "give comma-separated layer indices"),
    ({"engram_layers": "-1"}, "give comma-separated layer indices"),
    ({"engram_layers": "1,1"}, "names a layer twice"),
    ({"norm_position": "post"}, "needs norm_position=pre"),
    ({"engram_order": 1}, "model.engram_order must be 2 to 8"),
    ({"engram_heads": 3}, "engram_heads=3 does not divide model.engram_dim=8"),
    ({"engram_table_size": 0}, "model.engram_table_size must be 1 to"),
    ({"engram_conv": 0}, "model.engram_conv must be 1 to 16"),
    ({"engram_layers": "", "engram_order": 4}, "model.engram_order=4 is not used: no Engram layers"),
])
def test_bad_engram_options_are_refused_in_one_line(changes, said):
    with pytest.raises(ConfigError, match=said) as e:
        GPTConfig(**{**SHAPE, **changes}).validate()
    assert len(str(e.value).splitlines()) == 1


def test_a_file_that_sets_an_engram_size_without_engram_layers_is_refused():
    with pytest.raises(ConfigError, match=r"model\.engram_dim is not used"):
        ModelConfig.from_mapping({"family": "gpt", "engram_dim": 64})
    with pytest.raises(ConfigError, match=r"'model\.engram_layers' must be str"):
        ModelConfig.from_mapping({"family": "gpt", "engram_layers": [1, 3]})
    config = ModelConfig.from_mapping({"family": "gpt", "n_layer": 4, "engram_layers": 1})  # YAML's 1: the layer
    assert config.engram_layer_indices() == (1,)


def test_the_listed_layers_hold_an_engram_and_the_others_do_not():
    model = engram_gpt()
    assert [isinstance(b, EngramBlock) for b in model.blocks] == [True, False, True]
    with capture(model, "*hook_engram_out", "*engram.hook_gate") as seen:
        model(torch.randint(0, 30, (2, 5)))
    assert set(seen) == {"blocks.0.hook_engram_out", "blocks.2.hook_engram_out", "blocks.0.engram.hook_gate",
                         "blocks.2.engram.hook_gate"}
    assert not batches_exactly(model)  # left padding would reach the n-grams: prompts run one at a time


@pytest.mark.parametrize("changes", [{}, {"residual": "hyper", "residual_streams": 2},
                                     {"mixer": "hybrid", "positions": "none"}, {"moe_experts": 2, "moe_every": 2}],
                         ids=["attention", "hyper", "hybrid", "moe"])
def test_cached_decoding_equals_the_full_forward(changes):
    model = engram_gpt(**changes)
    T = model.config.block_size
    idx = torch.randint(0, 30, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx).logits
        for pieces in ([T], [5, 1, 2, T - 8], [1] * T):
            cache, logits, t = model.new_cache(2), [], 0
            for n in pieces:
                logits.append(model(idx[:, t:t + n], cache=cache).logits)
                t += n
            assert (torch.cat(logits, 1) - full).abs().max().item() < 1e-5, pieces


def test_generating_with_the_cache_gives_the_tokens_of_the_uncached_path():
    model = engram_gpt()
    prompt = torch.randint(0, 30, (1, 5), generator=torch.Generator().manual_seed(2))
    cached = generate(model, prompt, SamplingConfig(max_new_tokens=30, temperature=0.0, use_cache=True))
    plain = generate(model, prompt, SamplingConfig(max_new_tokens=30, temperature=0.0, use_cache=False))
    assert torch.equal(cached, plain) and cached.size(1) == 35  # past the context of 24: the sliding window


def test_save_and_load_round_trip(tmp_path):
    model = engram_gpt()
    model.set_engram_vocabulary([chr(ord("a") + i % 15) if i < 15 else chr(ord("A") + i % 15) for i in range(30)])
    assert model.blocks[0].engram.canon[15].item() == 0  # 'A' -> 'a'
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path)
    idx = torch.randint(0, 30, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(idx).logits, model(idx).logits)
    assert torch.equal(loaded.blocks[2].engram.canon, model.blocks[2].engram.canon)
    assert loaded.config.engram_layers == "0,2"


def test_the_tables_are_not_decayed_nor_counted_as_matmul_flops():
    model = engram_gpt()
    tables = {id(b.engram.table.weight) for b in model.blocks if isinstance(b, EngramBlock)}
    groups = make_optimizer(model, TrainConfig(weight_decay=0.1), fused=False).param_groups
    assert tables <= {id(p) for g in groups if g["weight_decay"] == 0.0 for p in g["params"]}
    total = sum(p.numel() for p in model.parameters())
    engram_tables, position_table = 2 * (3 - 1) * 2 * 13 * 4, 24 * 16  # 2 layers x 2 orders x 2 heads x 13 rows x 4
    assert active_parameters(model) == total - engram_tables - position_table
    assert 0.8 * total <= parameter_estimate(model.config) <= 1.2 * total


@pytest.fixture(scope="module")
def engram_run(tmp_path_factory):
    """The gpt-engram preset trained for a few steps on a small corpus, at a small width."""
    tmp = tmp_path_factory.mktemp("engram")
    corpus = write_corpus(tmp / "corpus.txt")
    argv = ["train", "gpt-engram", *tiny_overrides(corpus, tmp / "runs", name="e", max_iters=6, n_layer=4)]
    assert main(argv) == 0
    return tmp / "runs" / "e"


def test_the_preset_trains_and_samples(engram_run, capsys):
    model = from_pretrained(engram_run)
    assert model.config.engram_layers == "1,3" and model.config.n_layer == 4
    capsys.readouterr()
    assert main(["sample", str(engram_run), "--max-new-tokens", "20", "--prompt", "The "]) == 0
    assert capsys.readouterr().out.strip()


def test_the_preset_is_inspected(engram_run, tmp_path):
    assert main(["inspect", str(engram_run), "--text", "To be or not", "--out", str(tmp_path / "inspect")]) == 0
    assert any((tmp_path / "inspect").iterdir())


def test_export_refuses_an_engram_gpt_in_one_line(engram_run, tmp_path, capsys):
    capsys.readouterr()
    assert main(["export", str(engram_run), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert "engram_layers='1,3'" in err and "no n-gram memory" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "hf").exists()


def test_a_patching_sweep_runs_the_engram_blocks_on_the_corrupted_ids():
    from attnlab.inspect.sweep import residual_patching
    from attnlab.nn.hooks import hooks

    model = engram_gpt()
    clean, corrupted = torch.randint(0, 30, (2, 6)), torch.randint(0, 30, (2, 6))

    def metric(out):
        return (out.logits[:, -1, 3] - out.logits[:, -1, 4]).mean()

    grid = residual_patching(model, clean, corrupted, metric, max_rows=4)  # (L, T)
    with capture(model, "blocks.*.hook_resid_pre") as seen, torch.no_grad():
        model(clean)
    for layer, pos in ((0, 2), (1, 5), (2, 0)):
        def patch(x, name, layer=layer, pos=pos):
            x = x.clone()
            x[:, pos] = seen[f"blocks.{layer}.hook_resid_pre"][:, pos]
            return x

        with hooks(model, {f"blocks.{layer}.hook_resid_pre": patch}), torch.no_grad():
            expected = metric(model(corrupted)).item()
        assert abs(grid[layer, pos].item() - expected) < 1e-4
