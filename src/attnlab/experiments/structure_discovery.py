"""structure-discovery: a GPT trained on sentences of known grammars, against their exact entropy floor, and
what carries its long-range number agreement.

The grammars (regular, nested, cross-serial) and their exact entropy rates are in ``experiments/grammars.py``;
the causal tests of agreement in ``experiments/structure_agreement.py``.

Arms: one GPT per grammar (2 layers, 4 heads, d_model 64, learned positions, no dropout), AdamW with a
one-cycle schedule, clip 1.0, batch 32, context 64, ``steps`` steps on a ``train_tokens`` stream. The
learning rate is swept per arm and chosen on the loss of a separate validation stream; everything that
decides is scored on a third (test) stream and on fresh test sentences. Three seeds and one held-out seed
(experiments/study.py).

Scores. ratio_to_floor = the GPT's test loss / the mean true -ln p(x_t | x_<t) over exactly the same targets
(windows that start at a sentence boundary): no model beats 1 in expectation. For the agreement grammars,
on long-range pairs (the verb's noun is not the token that predicts it): agreement accuracy, the flip rate
when the noun's number is flipped, the probe for number, and the head with the largest attention from verb
to noun (chosen on validation sentences) ablated and patched (structure_agreement.py).

Verdict rule, fixed before the run (each part on the arm's tuned rate, 95% t interval over the 3 seeds):
    regular within 2%           Threshold(regular, ratio_to_floor < 1.02)
    nested within 2%            Threshold(nested, ratio_to_floor < 1.02)
    agreement learnt            Threshold(nested, agreement_accuracy > 0.95)
    the verb follows its noun   Threshold(nested, flip_rate > 0.9)
    number is readable          Threshold(nested, probe_final > 0.9)  (the embedding's probe is the control)
    one head carries it         Threshold(nested, top_head_patch_recovered > 0.5) and
                                Threshold(nested, top_head_ablation_share > 0.5)
The cross-serial grammar is measured the same way and reported beside; the lecture's claim names the nested one.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.experiments.base import label_axes, publishing, pyplot, save_figure, write_outputs
from attnlab.experiments.grammars import DEPTHS, GRAMMARS, entropy_rate, stream, vocabulary, windows
from attnlab.experiments.structure_agreement import DEPTHS as TEST_DEPTHS
from attnlab.experiments.structure_agreement import agreement_report, parse_head
from attnlab.experiments.study import Protocol, Threshold, fmt, outcome_lines, run_arms, verdict_of
from attnlab.models import GPTConfig
from attnlab.models.gpt import GPT
from attnlab.nn.hooks import capture
from attnlab.training.loop import fit

NAME = "structure-discovery"
CLAIM = ("A small GPT learns grammars of known entropy: on the regular and the nested (centre-embedded) grammar "
         "its test loss comes within 2% of the exact entropy floor; it learns the long-range number agreement "
         "(the verb follows its noun when the noun's number is flipped, and the number is linearly readable where "
         "the verb is predicted), and one attention head carries it (patching that head transfers most of the "
         "flip; ablating it removes most of the agreement).")
FULL = dict(steps=1000, context=64, batch=32, train_tokens=300_000, eval_windows=1024, sentences=256,
            lrs=[1e-3, 3e-3])
HELD_OUT_TOKENS = 60_000  # the validation and test streams' length, unless the settings give held_out_tokens
QUICK = dict(steps=30, context=32, batch=16, train_tokens=10_000, eval_windows=64, sentences=48, lrs=[3e-3],
             held_out_tokens=10_000)
RULES = [Threshold("regular", "ratio_to_floor", 1.02, above=False),
         Threshold("nested", "ratio_to_floor", 1.02, above=False),
         Threshold("nested", "agreement_accuracy", 0.95),
         Threshold("nested", "flip_rate", 0.9),
         Threshold("nested", "probe_final", 0.9),
         Threshold("nested", "top_head_patch_recovered", 0.5),
         Threshold("nested", "top_head_ablation_share", 0.5)]
VAL_STREAM, TEST_STREAM, SENTENCES = 1000, 2000, 3000  # data seeds, the same for every run
AGREEMENT_COLUMNS = ("grammar", "agreement acc.", "flip rate", "probe: embedding", "probe: last block",
                     "top head (per seed)", "its attention to the noun", "patch recovery", "ablation share",
                     "largest share of another head", "excess nll on verbs (nats)")
AGREEMENT_HEADER = "| " + " | ".join(AGREEMENT_COLUMNS) + " |\n" + "|---" * len(AGREEMENT_COLUMNS) + "|"


def train_gpt(grammar: str, s: dict[str, Any], seed: int, lr: float, device: str = "cpu") -> tuple[GPT, list[float]]:
    """Train a 2-layer GPT on a stream of ``train_tokens`` from ``grammar``; (model, training losses). The model is
    made on the CPU under ``seed`` and trained on ``device``; the windows are drawn on the CPU and moved there."""
    train = stream(grammar, s["train_tokens"], seed=seed + 1)
    cfg = GPTConfig(vocab_size=len(vocabulary(grammar)), block_size=s["context"], n_layer=2, n_head=4, d_model=64,
                    positions="learned", attn_backend="sdpa", dropout=0.0)
    torch.manual_seed(seed)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=s["steps"], pct_start=0.05,
                                                final_div_factor=30)
    g = torch.Generator().manual_seed(seed + 2)
    curve = fit(model, opt, lambda step: tuple(t.to(device) for t in windows(train, s["batch"], s["context"], g)[:2]),
                lambda b: model(b[0], targets=b[1]), s["steps"], grad_clip=1.0,
                after_step=lambda step, r: sched.step()).losses  # b = (x, y)
    return model.eval(), curve


@functools.lru_cache(maxsize=6)
def held_out_stream(grammar: str, data_seed: int, tokens: int = HELD_OUT_TOKENS) -> dict[str, Tensor]:
    """The validation or test stream of ``grammar`` (``tokens`` long: 60,000, a quick run's 10,000), the same for
    every run: made once per process (in pure Python 60,000 tokens take ~0.4 s) and only read."""
    return stream(grammar, tokens, seed=data_seed)


@torch.no_grad()
def stream_scores(model: GPT, grammar: str, s: dict[str, Any], data_seed: int) -> dict[str, Any]:
    """Loss on windows of a fresh stream against the floor over the same targets, and (agreement grammars) the
    excess loss on verbs that agree with a noun. The windows are drawn on the CPU and scored on the model's
    device; the per-token losses come back to the CPU."""
    data = held_out_stream(grammar, data_seed, s.get("held_out_tokens", HELD_OUT_TOKENS))
    x, y, floor_nll, begin = windows(data, s["eval_windows"], s["context"], torch.Generator().manual_seed(5))
    device = next(model.parameters()).device
    out = model(x.to(device), targets=y.to(device))
    result = {"loss": out.loss.item(), "floor_same_targets": floor_nll.mean().item()}
    result["ratio_to_floor"] = result["loss"] / result["floor_same_targets"]
    if grammar != "regular":
        model_nll = F.cross_entropy(out.logits.transpose(1, 2), y.to(device), reduction="none").cpu()  # (B, T)
        verbs = data["agree"][begin[:, None] + torch.arange(1, s["context"] + 1)] >= 0
        result["excess_nll_on_verbs"] = (model_nll[verbs] - floor_nll[verbs]).mean().item()
    return result


def seed_run(grammar: str, s: dict[str, Any], seed: int, lr: float, device: str = "cpu") -> dict[str, Any]:
    """One trained model: validation loss (chooses the rate), test scores, agreement tests, and the curves; trained
    and scored on ``device``."""
    model, curve = train_gpt(grammar, s, seed, lr, device)
    val, test = stream_scores(model, grammar, s, VAL_STREAM), stream_scores(model, grammar, s, TEST_STREAM)
    result: dict[str, Any] = {"val_loss": val["loss"], "test_loss": test["loss"],
                              "floor_same_targets": test["floor_same_targets"],
                              "ratio_to_floor": test["ratio_to_floor"],
                              "ratio_to_rate": test["loss"] / entropy_rate(grammar), "curve": curve}
    if grammar != "regular":
        result["excess_nll_on_verbs"] = test["excess_nll_on_verbs"]
        result |= agreement_report(model, grammar, s["sentences"], SENTENCES)
        result["example"] = example_map(model, grammar, result["top_head"])
    return result


@torch.no_grad()
def example_map(model: GPT, grammar: str, top: str) -> dict[str, Any]:
    """The top head's attention on one test window of 24 tokens (for the figure)."""
    data = stream(grammar, 5_000, seed=TEST_STREAM)
    x = windows(data, 1, 24, torch.Generator().manual_seed(5))[0]
    layer, h = parse_head(top)
    with capture(model, f"blocks.{layer}.mixer.hook_pattern") as seen:
        model(x.to(next(model.parameters()).device))
    return {"tokens": [vocabulary(grammar)[i] for i in x[0].tolist()],
            "map": next(iter(seen.values()))[0, h].cpu().tolist()}


def rule() -> list[str]:
    """The verdict rule every run records (it does not depend on the settings): ``RULES``, described."""
    return [r.describe() for r in RULES]


def run(out: Path, quick: bool = False, device: str = "cpu") -> dict[str, Any]:
    """Run the experiment (quick: fewer steps, tokens and sentences); writes results.json, report.md, plots. Every
    model is trained and scored on ``device``."""
    started = time.perf_counter()
    s = QUICK if quick else FULL
    protocol = Protocol(seeds=[0, 1, 2], budget={k: s[k] for k in ("steps", "batch", "context", "train_tokens")},
                        lr_sweep={g: list(s["lrs"]) for g in GRAMMARS}, verdict_rule=rule(),
                        select_on="val_loss", higher_is_better=False, confirm_seeds=[3])
    record: dict[tuple[str, float, int], dict[str, Any]] = {}
    arms = run_arms({g: (lambda seed, lr, g=g: seed_run(g, s, seed, lr, device)) for g in GRAMMARS}, protocol,
                    log=lambda line: None, record=record)
    runs = {g: [record[(g, arms[g]["lr"], seed)] for seed in protocol.seeds] for g in GRAMMARS}
    outcomes = [rule.decide(arms) for rule in RULES]
    verdict = verdict_of(outcomes)
    agreement = {g: {"top_heads": [r["top_head"] for r in runs[g]],
                     "ablation_shares": {h: [r["ablation_shares"][h] for r in runs[g]]
                                         for h in runs[g][0]["ablation_shares"]},
                     "probe": {k: [r["probe"][k] for r in runs[g]] for k in runs[g][0]["probe"]}}
                 for g in ("nested", "cross-serial")}
    results = {"settings": s, "depth_distribution": DEPTHS, "test_depths": TEST_DEPTHS,
               "entropy_rate": {g: entropy_rate(g) for g in GRAMMARS},
               "arms": arms, "agreement": agreement, "outcomes": outcomes}
    with publishing(out, NAME) as folder:
        _plot(runs, arms, agreement, folder)
        return write_outputs(folder, NAME, CLAIM, verdict, results, _report(s, protocol, arms, agreement, outcomes),
                             started, quick, protocol=protocol.as_dict(), device=device)


def _report(s: dict[str, Any], protocol: Protocol, arms: dict[str, Any], agreement: dict[str, Any],
            outcomes: list[dict[str, Any]]) -> str:
    rows = "\n".join(f"| {g} | {a['lr']:g} | {entropy_rate(g):.4f} | {fmt(a['floor_same_targets'], 4)} | "
                     f"{fmt(a['test_loss'], 4)} | {fmt(a['ratio_to_floor'], 4)} | "
                     f"{a['confirmation']['ratio_to_floor']['values'][0]:.4f} |" for g, a in arms.items())
    agree_rows = "\n".join(
        f"| {g} | {fmt(a['agreement_accuracy'])} | {fmt(a['flip_rate'])} | {fmt(a['probe_embedding'])} | "
        f"{fmt(a['probe_final'])} | {', '.join(agreement[g]['top_heads'])} | {fmt(a['top_head_attention'])} | "
        f"{fmt(a['top_head_patch_recovered'])} | {fmt(a['top_head_ablation_share'])} | "
        f"{fmt(a['other_heads_max_ablation_share'])} | {fmt(a['excess_nll_on_verbs'], 4)} |"
        for g, a in arms.items() if g != "regular")
    sweep = "; ".join(f"{g}: " + ", ".join(f"lr {lr} val loss {fmt(v['val_loss'], 4)}" for lr, v in a["by_lr"].items())
                      for g, a in arms.items())
    return f"""**Verdict rule, fixed before the run.** Seven parts on seeds {protocol.seeds} at each arm's tuned rate,
each decided by its 95% t interval; all must hold: the regular and the nested grammar within 2% of the floor;
on the nested grammar's long-range pairs, agreement accuracy above 0.95, flip rate above 0.9, the number probe
after the last block above 0.9, and the top head's patch recovery and ablation share both above 0.5.

**Setup.** attnlab's GPT (2 layers, 4 heads, d_model 64, learned positions), AdamW one-cycle, clip 1.0, batch
{s['batch']}, context {s['context']}, {s['steps']} steps on a {s['train_tokens'] // 1000}k-token stream per
grammar; learning rate chosen per grammar on a validation stream ({sweep}). Test: {s['eval_windows']} windows of
a third stream starting at a sentence boundary; "floor" is the mean true -ln p(x_t | x_<t) over the very same
targets. Agreement tests on {s['sentences']} fresh sentences per depth {TEST_DEPTHS} and long-range pairs only (the
noun is not the token that predicts the verb; chance 0.5): the top head is chosen on validation sentences by its
attention from the verb-predicting position to the noun, then scored on test sentences; the probe is fit on one
set of sentences and scored on another.

| grammar | lr | entropy rate | floor (same targets) | GPT test loss | ratio to floor | held-out seed |
|---|---|---|---|---|---|---|
{rows}

{AGREEMENT_HEADER}
{agree_rows}

{outcome_lines(outcomes)}

**Regime.** Toy grammars (8 nouns, 6 verbs, depth at most 4, every dependency inside one sentence) and a
2-layer model; studies of agreement in language models (Linzen et al. 2016; Lakretz et al. 2019; Finlayson et
al. 2021) use natural text, where agreement competes with everything else the model must predict. Figures:
`loss.png` (training loss against the floors), `heads.png` (the top head on one test window), `agreement.png`
(every head's ablation share and the probe by layer)."""


def _plot(runs: dict[str, list[dict[str, Any]]], arms: dict[str, Any], agreement: dict[str, Any], out: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    for ax, g in zip(axes, GRAMMARS):
        c = runs[g][0]["curve"]
        w = max(1, len(c) // 60)
        ax.plot([i * w for i in range(len(c) // w)], [sum(c[i * w:(i + 1) * w]) / w for i in range(len(c) // w)],
                label="train loss (seed 0)")
        rate = entropy_rate(g)
        ax.axhline(rate, color="k", ls="--", lw=1, label=f"entropy rate {rate:.3f}")
        ax.axhline(arms[g]["test_loss"]["mean"], color="tab:red", ls=":", lw=1,
                   label=f"test loss {arms[g]['test_loss']['mean']:.3f}")
        ax.set_ylim(rate * 0.9, rate * 1.6)
        label_axes(ax, "step", "nats per token", g, legend=7)
    save_figure(fig, out / "loss.png")
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    for ax, g in zip(axes, ("nested", "cross-serial")):
        ex = runs[g][0]["example"]
        ax.imshow(ex["map"], cmap="Blues", vmin=0, vmax=1)
        ax.set_xticks(range(len(ex["tokens"])), ex["tokens"], rotation=90, fontsize=7)
        ax.set_yticks(range(len(ex["tokens"])), ex["tokens"], fontsize=7)
        ax.set_title(f"{g}: top head {runs[g][0]['top_head']} of seed 0 (row = query, predicts the next token)",
                     fontsize=9)
    save_figure(fig, out / "heads.png")
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
    for i, g in enumerate(("nested", "cross-serial")):
        shares = agreement[g]["ablation_shares"]
        x = [k + (i - 0.5) * 0.38 for k in range(len(shares))]
        axes[0].bar(x, [sum(v) / len(v) for v in shares.values()], width=0.38, label=g)
        probe = agreement[g]["probe"]
        axes[1].plot(list(probe), [sum(v) / len(v) for v in probe.values()], marker="o", label=g)
    axes[0].set_xticks(range(len(shares)), list(shares), fontsize=8)
    label_axes(axes[0], "head (mean-ablated)", "share of agreement removed", "ablating one head (mean of 3 seeds)")
    axes[1].axhline(0.5, color="grey", ls=":", lw=1)
    label_axes(axes[1], "residual stream at", "probe accuracy (held out)", "number of the noun, read at the verb")
    save_figure(fig, out / "agreement.png")
