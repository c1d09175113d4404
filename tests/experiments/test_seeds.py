"""``fit_seeds`` (experiments/seeds.py): N seeds trained as one batched model equal N solo runs, each made as the
experiments make theirs (``torch.manual_seed``, the model, ``torch.optim.AdamW``, ``training.loop.fit``) on the
GPT of induction-heads and the ViT of placed digits / attention-saliency: plain, with clipping that clips, with
one seed's step non-finite, with dropout, with per-parameter weight decay, with evaluations that stop a seed,
and the refused cases."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.experiments.placed_digits import placed_vit
from attnlab.experiments.seeds import fit_seeds
from attnlab.models import GPTConfig, ViTConfig, build_model
from attnlab.training.loop import fit


def induction_gpt(d_model: int = 64, dropout: float = 0.0, backend: str = "sdpa") -> nn.Module:
    """induction-heads' GPT (train_one): 2 layers, 4 heads, RoPE, no bias; alphabet 64 + 2, 64 tokens."""
    return build_model(GPTConfig(vocab_size=66, block_size=64, n_layer=2, n_head=4, d_model=d_model,
                                 positions="rope", bias=False, dropout=dropout, attn_backend=backend))


def tokens(batch: int = 8, length: int = 33):
    """batches(seed): random token sequences from the seed's own generator."""
    def make(seed: int):
        g = torch.Generator().manual_seed(1000 + seed)
        return lambda step: torch.randint(0, 66, (batch, length), generator=g)
    return make


def images(batch: int = 16):
    """batches(seed): random canvases and labels from the seed's own generator (placed digits' shapes)."""
    def make(seed: int):
        g = torch.Generator().manual_seed(1000 + seed)
        return lambda step: {"images": torch.randn(batch, 1, 16, 16, generator=g),
                             "labels": torch.randint(0, 10, (batch,), generator=g)}
    return make


def lm_loss(model, seqs):
    return model(seqs[:, :-1], targets=seqs[:, 1:]).loss


def vit_loss(model, b):
    return model(**b)


def solo(build, seed, batches, loss, steps, *, lr, schedule=None, weight_decay=1e-2, betas=(0.9, 0.999),
         grad_clip=None, groups=None, after_step=None):
    """The solo run, as the experiments write it: (model, fit's losses, grad norms before clipping)."""
    torch.manual_seed(seed)
    model = build(seed)
    batch = batches(seed)
    params = groups(model) if groups else model.parameters()
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    norms = []

    def record(step, result):
        norms.append(float(result.grad_norm))
        return after_step(step, model) if after_step else None

    out = fit(model, opt, batch, lambda b: loss(model, b), steps, lr=schedule, grad_clip=grad_clip, after_step=record)
    return model, out, norms


def relative(a: list[float], b: list[float]) -> float:
    """The largest |a - b| / |a| over the steps (NaN steps must match)."""
    assert len(a) == len(b)
    worst = 0.0
    for x, y in zip(a, b):
        if math.isnan(x) or math.isnan(y):
            assert math.isnan(x) and math.isnan(y)
        else:
            worst = max(worst, abs(x - y) / abs(x))
    return worst


def check(run, model, out, rtol=1e-5, atol=1e-4) -> float:
    """The batched run equals the solo run: its losses, skipped steps, final weights and RNG state. (The weights to
    ``atol``: a ViT's key bias has a zero gradient up to rounding, which AdamW's normalisation turns into steps of
    up to lr in either direction.)"""
    worst = relative(out.losses, run.losses)
    assert worst <= rtol, (run.seed, worst)
    assert run.skipped == out.skipped
    for (name, p), q in zip(model.named_parameters(), run.model.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=atol, msg=name)
    assert torch.equal(run.rng_state, torch.get_rng_state())  # the solo run has just ended: its RNG is current
    return worst


def schedule(lr: float, steps: int, warmup: int):
    """placed digits' schedule: linear warm-up, then a linear decay to 5% of lr."""
    return lambda step: lr * min(1.0, (step + 1) / warmup) * (0.05 + 0.95 * (1 - step / steps))


def test_gpt_seeds_equal_their_solo_runs():
    build = lambda seed: induction_gpt()  # noqa: E731
    runs = fit_seeds(build, [0, 1, 2], tokens(), lm_loss, 10, lr=1e-3, weight_decay=0.0)
    assert [r.seed for r in runs] == [0, 1, 2] and all(len(r.losses) == 10 for r in runs)
    for run in runs:
        check(run, *solo(build, run.seed, tokens(), lm_loss, 10, lr=1e-3, weight_decay=0.0)[:2])
    assert len({r.losses[-1] for r in runs}) == 3  # the seeds differ


def test_vit_seeds_equal_solo_runs_with_clipping_that_clips():
    build = lambda seed: placed_vit()  # noqa: E731
    kw = dict(lr=2e-3, schedule=schedule(2e-3, 8, 3), weight_decay=0.05, grad_clip=0.05)
    runs = fit_seeds(build, [3, 4], images(), vit_loss, 8, **kw)
    for run in runs:
        model, out, norms = solo(build, run.seed, images(), vit_loss, 8, **kw)
        assert min(norms[1:]) > kw["grad_clip"]  # clipping is active (the first step of a zero head may not clip)
        check(run, model, out)


def test_one_seed_non_finite_step_is_skipped_alone():
    build = lambda seed: placed_vit()  # noqa: E731

    def batches(seed):
        draw = images()(seed)

        def batch(step):
            b = draw(step)
            if seed == 1 and step == 2:
                b["images"] = torch.full_like(b["images"], float("nan"))
            return b
        return batch

    kw = dict(lr=1e-3, schedule=schedule(1e-3, 6, 2), weight_decay=0.05, grad_clip=1.0)
    runs = fit_seeds(build, [0, 1, 2], batches, vit_loss, 6, **kw)
    assert [r.skipped for r in runs] == [0, 1, 0] and math.isnan(runs[1].losses[2])
    for run in runs:
        check(run, *solo(build, run.seed, batches, vit_loss, 6, **kw)[:2])


def test_dropout_masks_equal_the_solo_runs():
    # embedding, attention-probability (eager), residual and feed-forward dropout; the batches come from the
    # global RNG, interleaved with the masks as in the solo run
    build = lambda seed: induction_gpt(d_model=32, dropout=0.2, backend="eager")  # noqa: E731

    def batches(seed):
        return lambda step: torch.randint(0, 66, (4, 17))  # the global RNG

    runs = fit_seeds(build, [5, 6], batches, lm_loss, 5, lr=3e-3, weight_decay=0.0)
    for run in runs:
        check(run, *solo(build, run.seed, batches, lm_loss, 5, lr=3e-3, weight_decay=0.0)[:2])
    plain = fit_seeds(lambda seed: induction_gpt(d_model=32, backend="eager"), [5], batches, lm_loss, 5, lr=3e-3,
                      weight_decay=0.0)
    assert relative(plain[0].losses, runs[0].losses) > 1e-3  # the dropout was active


def test_vit_dropout_equals_solo():
    cfg = dict(image_size=16, patch_size=4, in_channels=1, n_classes=10, n_layer=2, n_head=4, d_model=32, d_ff=64,
               pooling="cls", dropout=0.1, attn_backend="eager")
    build = lambda seed: build_model(ViTConfig(**cfg))  # noqa: E731
    runs = fit_seeds(build, [0, 1], images(8), vit_loss, 4, lr=1e-3, grad_clip=1.0)
    for run in runs:
        check(run, *solo(build, run.seed, images(8), vit_loss, 4, lr=1e-3, grad_clip=1.0)[:2])


def test_a_dropout_mask_consumes_the_rng_as_dropout_does():
    x = torch.randn(3, 5, 7)
    torch.manual_seed(0)
    dropped = F.dropout(x, 0.3)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    mask = F.dropout(torch.ones(x.shape), 0.3)
    assert torch.equal(torch.get_rng_state(), after) and torch.equal(x * mask, dropped)


def test_grokking_groups_betas_evaluations_and_an_early_stop():
    # grokking's GPT and optimiser: weight decay on matrices only, betas (0.9, 0.98); evaluate every 2 steps and
    # stop seed 8 after its 4th step, as fit's after_step returning True does
    def build(seed):
        return build_model(GPTConfig(vocab_size=24, block_size=3, n_layer=1, n_head=4, d_model=32,
                                     positions="learned", tie_embeddings=False, bias=True))

    def batches(seed):
        g = torch.Generator().manual_seed(seed + 1)
        return lambda step: (torch.randint(0, 23, (16, 3), generator=g), torch.randint(0, 23, (16,), generator=g))

    def loss(model, b):
        return F.cross_entropy(model(b[0]).logits[:, -1], b[1])

    def groups(model):
        return [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 1.0},
                {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]

    seen = []

    def evaluate(done, seed, model):
        seen.append((done, seed))
        assert model.training
        return seed == 8 and done == 4

    kw = dict(lr=1e-3, schedule=lambda step: 1e-3 * min(1.0, (step + 1) / 3), betas=(0.9, 0.98))
    runs = fit_seeds(build, [7, 8], batches, loss, 7, weight_decay=lambda name, p: 1.0 if p.dim() >= 2 else 0.0,
                     every=2, evaluate=evaluate, evaluate_first=True, **kw)
    assert seen == [(0, 7), (0, 8), (2, 7), (2, 8), (4, 7), (4, 8), (6, 7)]
    assert [len(r.losses) for r in runs] == [7, 4]
    stop = lambda step, model: step + 1 == 4  # noqa: E731
    check(runs[0], *solo(build, 7, batches, loss, 7, groups=groups, **kw)[:2])
    check(runs[1], *solo(build, 8, batches, loss, 7, groups=groups, after_step=stop, **kw)[:2])


class _Normed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer, self.norm = nn.Linear(4, 4), nn.BatchNorm1d(4)

    def forward(self, x):
        return self.norm(self.layer(x)).sum()


def test_refused_cases():
    x = lambda seed: lambda step: torch.randn(8, 4)  # noqa: E731
    with pytest.raises(ValueError, match="batch norm"):
        fit_seeds(lambda seed: _Normed(), [0, 1], x, lambda m, b: m(b), 1, lr=1e-3)
    with pytest.raises(ValueError, match="attn_backend='eager'"):
        fit_seeds(lambda seed: induction_gpt(32, dropout=0.1), [0, 1], tokens(2, 9), lm_loss, 1, lr=1e-3)
    with pytest.raises(ValueError, match="global RNG"):  # a random op in the loss: not reproducible per seed
        fit_seeds(lambda seed: nn.Linear(4, 1), [0, 1], x, lambda m, b: m(b + torch.randn(4)).sum(), 1, lr=1e-3)


@pytest.mark.slow
def test_eight_seeds_equal_eight_solo_runs_over_200_steps(capsys):
    """The done-when check: the experiments' own GPT (induction-heads' train_one: its data and optimiser) and ViT
    (placed digits' train_placed_vit), 8 seeds batched against 8 solo runs, losses within 1e-5 relative."""
    from attnlab.experiments.induction_heads import repeated_segments
    from attnlab.experiments.placed_digits import placed_splits, train_placed_vit

    steps, seeds = 200, list(range(8))

    def gpt_batches(seed):
        data_seed = iter(range(seed * 1_000_000, (seed + 1) * 1_000_000))
        return lambda step: repeated_segments(32, 65, 64, seed=next(data_seed))[0]

    runs = fit_seeds(lambda seed: induction_gpt(), seeds, gpt_batches, lm_loss, steps, lr=1e-3, weight_decay=0.0)
    gpt = max(check(r, *solo(lambda s: induction_gpt(), r.seed, gpt_batches, lm_loss, steps, lr=1e-3,
                             weight_decay=0.0)[:2], atol=1e-3) for r in runs)

    data = {seed: placed_splits(seed, {"train": 1400})["train"] for seed in seeds}

    def vit_batches(seed):
        gen = torch.Generator().manual_seed(seed)
        x, y = data[seed][:2]

        def batch(step):
            i = torch.randint(0, len(x), (64,), generator=gen)
            return {"images": x[i], "labels": y[i]}
        return batch

    kw = dict(lr=2e-3, schedule=schedule(2e-3, steps, 100), weight_decay=0.05, grad_clip=1.0)
    runs = fit_seeds(lambda seed: placed_vit(), seeds, vit_batches, vit_loss, steps, **kw)
    vit = max(check(r, *solo(lambda s: placed_vit(), r.seed, vit_batches, vit_loss, steps, **kw)[:2], atol=1e-3)
              for r in runs)
    for r in runs[:2]:  # and the weights equal those of the experiment's own function (two seeds: time)
        trained = train_placed_vit(r.seed, 2e-3, steps, *data[r.seed][:2])
        for p, q in zip(trained.parameters(), r.model.parameters()):
            torch.testing.assert_close(q, p, rtol=0, atol=1e-3)
    with capsys.disabled():
        print(f"\nworst relative loss difference over {steps} steps, 8 seeds: GPT {gpt:.2e}, ViT {vit:.2e}")
