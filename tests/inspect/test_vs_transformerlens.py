"""attnlab's lens against TransformerLens on one GPT-2: a random-init ``transformers.GPT2LMHeadModel`` saved here,
read by ``attnlab import-hf`` and by TransformerLens's ``TransformerBridge`` (offline, from the same folder). Every
hook point of docs/lens.md's table holds the same tensor in both (unprocessed, ``fold_ln`` alone, and all four
weight-processing steps), the logit lens grid is the same, and IOI-style activation patching (heads by position,
the residual stream) and path patching (direct, and through the MLPs) give the same metric, all to 1e-4."""

from __future__ import annotations

import os

import pytest
import torch

tl = pytest.importorskip("transformer_lens", reason="transformer_lens is a dev dependency (transformer-lens)")
transformers = pytest.importorskip("transformers")

from transformer_lens import patching as tl_patching  # noqa: E402
from transformer_lens.model_bridge import TransformerBridge  # noqa: E402
from transformer_lens.tools.analysis.logit_lens import logit_lens as tl_logit_lens  # noqa: E402

from attnlab.inspect.circuits import path_patch  # noqa: E402
from attnlab.inspect.fold import process_weights  # noqa: E402
from attnlab.inspect.intervene import Site, head, logit_difference, patch_recovery, run_with_cache  # noqa: E402
from attnlab.inspect.lens import logit_lens_grid  # noqa: E402
from attnlab.inspect.sweep import head_patching, residual_patching  # noqa: E402
from attnlab.inspect.tlnames import POINTS, attnlab_points, to_transformerlens  # noqa: E402
from attnlab.interop.hf import import_hf  # noqa: E402
from attnlab.models.registry import from_pretrained  # noqa: E402

V, L, H = 1000, 2, 4
ALL = dict(fold_ln=True, center_writing_weights=True, center_unembed=True, fold_value_biases=True)
OPTIONS = {"none": {}, "fold_ln": dict(fold_ln=True), "all": ALL}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """An HF GPT-2 folder (LayerNorm gains and every bias moved off their init, so folding has work to do) and
    its attnlab import."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=64, n_layer=L, n_head=H, bos_token_id=0,
                                  eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  initializer_range=0.25)  # GPT-2's 0.02 leaves the heads' effects near 0
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if ".ln_" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(root / "hf")
    import_hf(root / "hf", root / "attnlab")
    return root / "hf", root / "attnlab"


def both(folders, options: dict):
    """(the attnlab model, the TransformerLens bridge) with the same weight processing."""
    hf_dir, ours_dir = folders
    model = from_pretrained(ours_dir).eval()
    process_weights(model, options.get("fold_ln", False), options.get("center_writing_weights", False),
                    options.get("center_unembed", False), options.get("fold_value_biases", False))
    bridge = TransformerBridge.boot_transformers(str(hf_dir), device="cpu")
    if options:
        bridge.enable_compatibility_mode(disable_warnings=True, **{k: options.get(k, False) for k in ALL})
    else:
        bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return model, bridge


@pytest.fixture(scope="module")
def processed(folders):
    return both(folders, ALL)


def ioi(n: int, seed: int = 0):
    """IOI-style pairs of 9 tokens, "When A and B went , B gave to" -> A; corrupted: the second B is a third
    name C. Returns clean, corrupted (n, 9), the answer A and the wrong name B per pair."""
    g = torch.Generator().manual_seed(seed)
    when, and_, went, comma, gave, to = torch.randperm(V, generator=g)[:6].tolist()
    clean, corrupted, answer, wrong = [], [], [], []
    for _ in range(n):
        a, b, c = (torch.randperm(V - 100, generator=g)[:3] + 100).tolist()
        clean.append([when, a, and_, b, went, comma, b, gave, to])
        corrupted.append([when, a, and_, b, went, comma, c, gave, to])
        answer.append(a)
        wrong.append(b)
    return torch.tensor(clean), torch.tensor(corrupted), torch.tensor(answer), torch.tensor(wrong)


def tl_metric(answer, wrong):
    def metric(logits):
        last = logits[:, -1]
        rows = torch.arange(last.size(0))
        return (last[rows, answer] - last[rows, wrong]).mean()

    return metric


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_mapped_hook_holds_what_transformerlens_holds(folders, name):
    model, bridge = both(folders, OPTIONS[name])
    bridge.set_use_attn_result(True)  # TransformerLens forms hook_result only when asked
    idx = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        tl_logits, tl_cache = bridge.run_with_cache(idx)
    out, cache = run_with_cache(model, idx, attnlab_points(L))
    ours = to_transformerlens(cache)
    assert len(ours) == L * (len(POINTS) - 2) + 2
    torch.testing.assert_close(out.logits, tl_logits, atol=1e-4, rtol=0)
    for key, x in ours.items():
        want = tl_cache[key]
        assert x.shape == want.shape, key
        finite = torch.isfinite(want)
        assert torch.equal(torch.isfinite(x), finite), key  # the masked scores are -inf in both
        torch.testing.assert_close(x[finite], want[finite], atol=1e-4, rtol=0, msg=key)


def test_processing_leaves_the_predictions_and_folds_the_norms(folders, processed):
    plain = from_pretrained(folders[1]).eval()
    model = processed[0]
    idx = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(idx).logits.log_softmax(-1), plain(idx).logits.log_softmax(-1),
                                   atol=1e-4, rtol=0)
    for norm in [*(b.norm_mixer for b in model.blocks), *(b.norm_ffn for b in model.blocks), model.norm_f]:
        assert torch.equal(norm.weight, torch.ones_like(norm.weight)) and not norm.bias.any()
    _, cache = run_with_cache(model, idx, "blocks.*.hook_resid_pre")
    assert cache["blocks.1.hook_resid_pre"].mean(-1).abs().max() < 1e-5  # centred writing weights
    assert model.lm_head.weight.mean(0).abs().max() < 1e-6  # centred unembedding
    assert not model.blocks[0].mixer.qkv_proj.bias[2 * 64:].any()  # value biases folded into b_O


def test_the_logit_lens_grid_is_transformerlens_logit_lens(processed):
    model, bridge = processed
    idx = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(3))
    top, p = logit_lens_grid(model, idx)  # (L+1, B, T)
    with torch.no_grad():
        theirs = tl_logit_lens(bridge, idx, positions=None, return_type="probs", top_k=1)
    assert theirs.labels == ["0_pre", "1_pre", "final_post"]
    assert torch.equal(top, theirs.readout.top_ids[..., 0])
    torch.testing.assert_close(p, theirs.readout.values[..., 0], atol=1e-4, rtol=0)


def test_activation_patching_agrees_by_head_and_position_and_on_the_stream(processed):
    model, bridge = processed
    clean, corrupted, answer, wrong = ioi(4)
    metric, theirs = logit_difference(answer, wrong), tl_metric(answer, wrong)
    with torch.no_grad():
        _, tl_clean = bridge.run_with_cache(clean)
        cells = tl_patching.make_df_from_ranges([L, 9, H], ["layer", "pos", "head"])
        cells = cells[cells["pos"].isin([3, 6, 8])]  # B, S2 and the end: TransformerLens runs one forward a cell
        tl_heads = tl_patching.get_act_patch_attn_head_out_by_pos(bridge, corrupted, tl_clean, theirs,
                                                                  index_axis_names=None, index_df=cells)
        tl_resid = tl_patching.get_act_patch_resid_pre(bridge, corrupted, tl_clean, theirs)
    ours = head_patching(model, clean, corrupted, metric, max_rows=40)  # (L, T, H), several passes a layer
    picked = ours[cells["layer"].tolist(), cells["pos"].tolist(), cells["head"].tolist()]
    torch.testing.assert_close(picked, tl_heads, atol=1e-4, rtol=0)
    torch.testing.assert_close(residual_patching(model, clean, corrupted, metric), tl_resid, atol=1e-4, rtol=0)
    base = patch_recovery(model, clean, corrupted, [], metric)
    assert (ours - base.corrupted).abs().max() > 0.1 * abs(base.clean - base.corrupted)  # cells that matter
    # one cell of the batched sweep is the one patched run that intervene.patch_recovery makes
    one = patch_recovery(model, clean, corrupted, [Site("blocks.1.mixer.hook_z", head=2, positions=(6,))], metric)
    assert ours[1, 6, 2].item() == pytest.approx(one.patched, abs=1e-5)


def _tl_direct_path(bridge, clean_z, corr_z, sender, receivers, corrupted, metric):
    """TransformerLens's direct path patching (``patching.get_act_patch_direct_path``) into every input of the
    receivers at once: the sender's clean-minus-corrupted write added to each receiver's q, k and v input."""
    layer, h = sender
    W_O = bridge.blocks[layer].attn.W_O[h]  # (D, C)
    delta = clean_z[:, :, h] @ W_O - corr_z[:, :, h] @ W_O  # (B, T, C)

    def add(x, hook, heads):
        x = x.clone()
        x[:, :, heads] += delta[:, :, None]
        return x

    fwd = []
    for r_layer in sorted({r[0] for r in receivers}):
        heads = [r[1] for r in receivers if r[0] == r_layer]
        fwd += [(f"blocks.{r_layer}.attn.hook_{c}_input", lambda x, hook, heads=heads: add(x, hook, heads))
                for c in "qkv"]
    bridge.set_use_split_qkv_input(True)
    try:
        return metric(bridge.run_with_hooks(corrupted, fwd_hooks=fwd)).item()
    finally:
        bridge.set_use_split_qkv_input(False)


def _tl_path_through_mlps(bridge, clean_cache, corr_cache, sender, receivers, corrupted, metric):
    """Wang et al.'s path patching written with TransformerLens's hooks: every head frozen at its corrupted
    output but the sender (clean) and the receivers (recomputed), the MLPs recomputed; then the receivers'
    outputs from that run put into the corrupted run."""
    frozen = {}

    def freeze(z, hook, layer):
        new = corr_cache[f"blocks.{layer}.attn.hook_z"].clone()
        for r_layer, r_head in receivers:
            if r_layer == layer:
                new[:, :, r_head] = z[:, :, r_head]
        if layer == sender[0]:
            new[:, :, sender[1]] = clean_cache[f"blocks.{layer}.attn.hook_z"][:, :, sender[1]]
        frozen[layer] = new
        return new

    bridge.run_with_hooks(corrupted, fwd_hooks=[(f"blocks.{layer}.attn.hook_z",
                                                 lambda z, hook, layer=layer: freeze(z, hook, layer))
                                                for layer in range(L)])

    def patch(z, hook, layer):
        z = z.clone()
        for r_layer, r_head in receivers:
            if r_layer == layer:
                z[:, :, r_head] = frozen[layer][:, :, r_head]
        return z

    layers = sorted({r[0] for r in receivers})
    return metric(bridge.run_with_hooks(corrupted, fwd_hooks=[(f"blocks.{layer}.attn.hook_z",
                                                               lambda z, hook, layer=layer: patch(z, hook, layer))
                                                              for layer in layers])).item()


@pytest.mark.parametrize("through_mlps", [False, True])
def test_path_patching_agrees(processed, through_mlps):
    model, bridge = processed
    clean, corrupted, answer, wrong = ioi(4, seed=2)
    sender, receivers = (0, 2), [(1, 0), (1, 3)]  # recovered 0.26 on the direct path, 0.93 through the MLPs
    with torch.no_grad():
        _, tl_clean = bridge.run_with_cache(clean, names_filter=lambda n: n.endswith("attn.hook_z"))
        _, tl_corr = bridge.run_with_cache(corrupted, names_filter=lambda n: n.endswith("attn.hook_z"))
        z = "blocks.0.attn.hook_z"
        if through_mlps:
            want = _tl_path_through_mlps(bridge, tl_clean, tl_corr, sender, receivers, corrupted,
                                         tl_metric(answer, wrong))
        else:
            want = _tl_direct_path(bridge, tl_clean[z], tl_corr[z], sender, receivers, corrupted,
                                   tl_metric(answer, wrong))
    ours = path_patch(model, clean, corrupted, head(*sender), [head(*r) for r in receivers],
                      logit_difference(answer, wrong), through_mlps=through_mlps)
    assert ours.patched == pytest.approx(want, abs=1e-4)
    assert abs(ours.patched - ours.corrupted) > 0.05 * abs(ours.clean - ours.corrupted)  # the path carries something
