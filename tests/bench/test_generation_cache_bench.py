"""benchmarks/generation_cache.py: decoding with a cache for every mixer (MHA, GQA, MQA, MLA plain and absorbed,
SSM, hybrid). Tiny shapes here: the whole run through the command line (it had broken unnoticed when the blocks'
attention became ``block.mixer``), each variant's cached decoding equal to one full forward pass, and the MLA
switch it relies on actually switching."""

from __future__ import annotations

import json

from attnlab.nn.attention.latent import MultiHeadLatentAttention
from tests.helpers import bench_here, load_benchmark


def test_every_variant_decodes_with_its_cache_as_the_full_pass_does(tmp_path):
    out = tmp_path / "gc.json"
    assert bench_here("generation_cache", "--contexts", "16", "32", "--d-model", "32", "--heads", "4",
                      "--n-layer", "2", "--steps", "3", "--rounds", "1", "--warmup", "1", "--check-context", "8",
                      "--check-tokens", "4", "--out", str(out)) == 0
    rows = {r["variant"]: r for r in json.loads(out.read_text())["variants"]}
    assert set(rows) == {"MHA", "GQA (2 kv)", "MQA (1 kv)", "MLA", "MLA absorbed", "SSM", "hybrid (SSM+MHA)"}
    assert all(r["cache_equivalence_max_abs_diff"] < 1e-4 for r in rows.values()), rows
    assert rows["MLA absorbed"]["absorb"] and rows["SSM"]["cache_bytes_per_token_all_layers"] == 0


def test_the_absorb_switch_reaches_every_latent_layer(monkeypatch):
    module = load_benchmark("generation_cache")
    args = module.argparse.Namespace(seed=0, vocab=64, n_layer=2, heads=4, d_model=32)
    mla = next(v for v in module.variants(8) if v.name == "MLA absorbed")
    model = module.build(args, mla, block_size=32)
    layers = [b.mixer for b in model.blocks if isinstance(b.mixer, MultiHeadLatentAttention)]
    assert len(layers) == 2
    for absorb in (True, False):
        module.set_absorb(model, absorb)
        assert all(layer.absorb is absorb for layer in layers)
