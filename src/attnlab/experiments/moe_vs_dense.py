"""moe-vs-dense: at equal compute per token, does a mixture of experts reach a lower loss than a dense model?

Model: a char-level GPT on Shakespeare (``n_layer`` layers, d_model ``d``, 4 heads, context ``context``,
learned positions, the 80/10/10 split of experiments/scaling.py). Arms:

    dense          feed-forward of width 4d                         (the active FLOPs of every top-1 MoE)
    dense-wide     feed-forward of width 16d                        (the total parameters of moe-4-top1)
    moe-E-top1     E in {4, 8, 16} experts of width 4d, top-1 routing (Switch), capacity factor 1.25
    moe-8-top2     8 experts, top-2: twice the expert FLOPs per token of top-1

Every arm sees the same tokens (``steps`` steps of batch x context), with a cosine schedule, its own
learning-rate sweep (chosen on validation loss), 3 seeds and a held-out seed (experiments/study.py).
Training FLOPs per token follow Kaplan et al. (2020): C = 6 (N_active + n_layer T d), N_active = the
non-embedding parameters one token uses (attention, its top-k experts, the router; the dense FFN);
validation loss every ``eval_every`` steps gives each arm's loss-vs-FLOPs curve. Wall time per training
step is measured separately, the arms interleaved over ``time_rounds`` rounds (medians; ratios to dense).

Verdict rule, fixed before the run: for every top-1 MoE, Difference(moe, dense, test_loss, lower is better)
> 0 by its 95% Welch interval: held if all three hold, not held if one interval lies wholly short of 0 even at
the family-wise level 1 - 0.05/3 (Bonferroni over the three, experiments/verdicts.py), else not decidable. The
top-2 arm and dense-wide (equal total parameters, 4x the FFN FLOPs) are reported with their intervals.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

import torch

from attnlab.experiments.base import interleaved_seconds, label_axes, publishing, pyplot, save_figure, write_outputs
from attnlab.experiments.partial import run_parts
from attnlab.experiments.scaling import char_data, evaluate, non_embedding_params, text_of, warmup_cosine, windows
from attnlab.experiments.study import Difference, Protocol, edge_text, fmt, outcome_lines, run_arms, verdict_of
from attnlab.models import GPTConfig
from attnlab.models.gpt import GPT
from attnlab.training.loop import fit

NAME = "moe-vs-dense"
CLAIM = ("At equal compute per token a mixture of experts (top-1 routing, 4 to 16 experts) reaches a lower test "
         "loss than the dense model it replaces, after the same tokens.")
ARMS = {"dense": dict(ffn=4), "dense-wide": dict(ffn=16), "moe-4-top1": dict(ffn=4, experts=4, top_k=1),
        "moe-8-top1": dict(ffn=4, experts=8, top_k=1), "moe-16-top1": dict(ffn=4, experts=16, top_k=1),
        "moe-8-top2": dict(ffn=4, experts=8, top_k=2)}
# Sized for the 2-core CPU's 45-minute limit with --workers 2 (measured: one step of all six arms together costs
# ~0.62 s on one core at d_model 64, ~0.92 s at 96; 3000 steps at 96 would take ~2.5 h): 1500 steps of 32 x 64
# characters, 3.1M per arm, ~3.4 epochs of the training split. Rates: the run with 1e-3 / 3e-3 extended twice
# left five of six arms at the top (2.7e-2, still improving), so the sweep starts a decade higher (3e-3 to 3e-2)
# and may extend twice more, to 0.27 (or down to 2.7e-4).
FULL = dict(n_layer=3, d_model=64, context=64, batch=32, steps=1500, eval_every=250, lrs=[3e-3, 1e-2, 3e-2],
            time_rounds=7, extend_edges=2)
QUICK = dict(n_layer=1, d_model=32, context=32, batch=8, steps=20, eval_every=10, lrs=[3e-3], time_rounds=2)
RULES = [Difference(arm, "dense", "test_loss", higher_is_better=False)
         for arm in ARMS if arm.startswith("moe") and arm.endswith("top1")]


def rule() -> list[str]:
    """The verdict rule a run records in results.json (``protocol.verdict_rule``)."""
    return [r.describe() for r in RULES]


def config(arm: str, s: dict[str, Any], vocab: int) -> GPTConfig:
    """The GPT of one arm."""
    a = ARMS[arm]
    return GPTConfig(vocab_size=vocab, block_size=s["context"], n_layer=s["n_layer"], n_head=4,
                     d_model=s["d_model"], d_ff=a["ffn"] * s["d_model"], positions="learned", dropout=0.0,
                     moe_experts=a.get("experts", 0), moe_top_k=a.get("top_k", 2))


def active_params(arm: str, model: GPT) -> int:
    """Non-embedding parameters one token uses: the whole model for dense arms; for an MoE, its top-k of E
    experts (the others sit idle) plus everything else."""
    n = non_embedding_params(model)
    a = ARMS[arm]
    if not a.get("experts"):
        return n
    # the experts' stacked weights (E, ...): blocks.{i}.ffn.{w_in, b_in, w_out, b_out}; the router is always used
    expert = sum(p.numel() for name, p in model.named_parameters() if ".ffn." in name and ".router." not in name)
    return n - expert + expert * a["top_k"] // a["experts"]


def flops_per_token(arm: str, model: GPT, s: dict[str, Any]) -> float:
    """Training FLOPs per token, C = 6 (N_active + n_layer T d) (Kaplan et al. 2020, Table 1)."""
    return 6.0 * (active_params(arm, model) + s["n_layer"] * s["context"] * s["d_model"])


def train_arm(arm: str, s: dict[str, Any], data: dict[str, torch.Tensor], vocab: int, seed: int,
              lr: float, device: str = "cpu") -> dict[str, Any]:
    """One run on ``device`` (the model made on the CPU under ``seed``, then moved; the windows drawn on the CPU
    and moved): validation curve against training FLOPs, final validation and test loss, the expert load."""
    torch.manual_seed(seed)
    model = GPT(config(arm, s, vocab)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(seed + 1)
    T, B, steps = s["context"], s["batch"], s["steps"]
    train = data["train"]
    c = flops_per_token(arm, model, s)
    curve: list[tuple[float, float]] = []

    def after(step: int, _r: Any) -> None:
        if (step + 1) % s["eval_every"] == 0:
            curve.append(((step + 1) * B * T * c, evaluate(model, data["val"], data["val_starts"], T, B)))

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = windows(train, torch.randint(len(train) - T - 1, (B,), generator=g), T)
        return x.to(device), y.to(device)

    fit(model, opt, batch, lambda b: model(b[0], targets=b[1]), steps,
        lr=lambda step: warmup_cosine(lr, step, steps, 50), grad_clip=1.0, after_step=after)
    return {"val_loss": evaluate(model, data["val"], data["val_starts"], T, B),
            "test_loss": evaluate(model, data["test"], data["test_starts"], T, B),
            "total_params": sum(p.numel() for p in model.parameters()), "active_params": active_params(arm, model),
            "flops_per_token": c, "train_flops": steps * B * T * c, "curve": curve}


def step_times(s: dict[str, Any], vocab: int) -> dict[str, list[float]]:
    """Seconds per training step (forward + backward + AdamW) of every arm, arms interleaved in a shuffled order
    in each of ``time_rounds`` rounds (3 steps each, after a warm-up), on the CPU whatever the training's device
    (the ratios are this CPU's)."""
    models = {arm: GPT(config(arm, s, vocab)) for arm in ARMS}
    opts = {arm: torch.optim.AdamW(m.parameters(), lr=1e-4) for arm, m in models.items()}
    x = torch.randint(vocab, (s["batch"], s["context"]), generator=torch.Generator().manual_seed(0))

    def step(arm: str) -> None:
        opts[arm].zero_grad(set_to_none=True)
        models[arm](x, targets=x).loss.backward()
        opts[arm].step()

    for arm in ARMS:
        step(arm)
    return interleaved_seconds({arm: (lambda arm=arm: step(arm)) for arm in ARMS}, s["time_rounds"], random.Random(0),
                               per_round=3)


def run(out: Path, quick: bool = False, resume: bool = False, data: Path | None = None,
        device: str = "cpu") -> dict[str, Any]:
    """Run the experiment (quick: one tiny layer, 20 steps) on the text ``data`` (``scaling.text_of``:
    tinyshakespeare by default), every run trained on ``device`` (a torch device string; the step times are
    measured on the CPU); writes results.json, report.md and curves.png. Each single training run is kept in
    ``out/.runs/`` as it finishes; ``resume``: take the runs kept there (same settings, and with ``data`` the same
    text) and run only the rest."""
    s = QUICK if quick else FULL
    text, about = text_of(data, s["context"])
    # a run given --data keeps its runs under the text's hash too: a resume on another text is refused
    key = {**s, "text_sha256": about["sha256"]} if data is not None else s
    splits, vocab = char_data(s["context"], text)
    protocol = Protocol(seeds=[0, 1, 2], budget={k: s[k] for k in ("steps", "batch", "context", "eval_every")},
                        lr_sweep={arm: list(s["lrs"]) for arm in ARMS}, verdict_rule=rule(),
                        select_on="val_loss", higher_is_better=False, confirm_seeds=[3],
                        extend_edges=s.get("extend_edges", 0))
    record: dict[tuple[str, float, int], dict[str, Any]] = {}

    def training(_: str, keep: Path) -> dict[str, Any]:  # every run of the study, one part
        fns = {arm: (lambda seed, lr, arm=arm: train_arm(arm, s, splits, vocab, seed, lr, device)) for arm in ARMS}
        arms = run_arms(fns, protocol, log=lambda line: None, record=record, keep=keep)
        return {"arms": arms, "curves": {arm: [record[(arm, arms[arm]["lr"], seed)]["curve"] for seed in protocol.seeds]
                                         for arm in ARMS}}

    parts, _, started = run_parts(out, NAME, key, quick, ["training"], training, resume, keep_runs=True)
    arms, curves = parts["training"]["arms"], parts["training"]["curves"]
    outcomes = [r.decide(arms) for r in RULES]
    verdict = verdict_of(outcomes)
    others = {arm: Difference(arm, "dense", "test_loss", higher_is_better=False).decide(arms)
              for arm in ("moe-8-top2", "dense-wide")}
    times = step_times(s, vocab)
    ratios = {arm: [a / d for a, d in zip(t, times["dense"])] for arm, t in times.items()}  # paired by round
    results = {"settings": s, "text": about, "arms": arms, "outcomes": outcomes, "reported": others,
               "step_seconds": times,
               "time_ratio_to_dense": {arm: statistics.median(t) / statistics.median(times["dense"])
                                       for arm, t in times.items()},
               "time_ratio_range": {arm: [min(r), max(r)] for arm, r in ratios.items()},
               "curves": curves}
    body = _report(s, arms, outcomes, others, results, protocol)
    with publishing(out, NAME) as folder:
        _plot(curves, arms, folder)
        return write_outputs(folder, NAME, CLAIM, verdict, results, body, started, quick,
                             protocol=protocol.as_dict(), data=Path(about["file"]), device=device)


def _report(s, arms, outcomes, others, results, protocol) -> str:
    dense = arms["dense"]["test_loss"]["mean"]
    rows = "\n".join(
        f"| {arm} | {int(a['total_params']['mean']):,} | {int(a['active_params']['mean']):,} | "
        f"{a['flops_per_token']['mean'] / 1e6:.2f} | {a['lr']:g} | {fmt(a['test_loss'], 4)} | "
        f"{a['test_loss']['mean'] - dense:+.4f} | {a['confirmation']['test_loss']['values'][0]:.4f} | "
        f"{results['time_ratio_to_dense'][arm]:.2f} ({_range(results, arm)}) |" for arm, a in arms.items())
    held_out = _held_out_text(arms, RULES, outcomes, protocol)
    reported = "\n".join(f"- {arm} vs dense: difference {o['difference']:+.4f} in dense's favour if negative, 95% "
                         f"interval [{o['interval'][0]:+.4f}, {o['interval'][1]:+.4f}] ({o['verdict']} as "
                         f"'{arm} beats dense')" for arm, o in others.items())
    return f"""**Verdict rule, fixed before the run.** Every top-1 MoE beats dense on test loss (lower is better) by
its 95% Welch interval (seeds {protocol.seeds}, each arm at its tuned rate); held if all do, not held if an
interval lies wholly short of 0 even at the family-wise level 1 - 0.05/{len(outcomes)} (Bonferroni: with
{len(outcomes)} intervals at 95%, one misses by chance up to {len(outcomes)} times as often), else not decidable.

**Setup.** Char-level on {results['text']['file']} ({results['text']['chars']:,} chars), GPT with {s['n_layer']}
layers, d_model {s['d_model']}, 4 heads, context {s['context']}, batch {s['batch']}; {s['steps']} steps
({s['steps'] * s['batch'] * s['context']:,} characters, the same for every arm), AdamW (0.9, 0.95, weight decay
0.1), warmup 50 steps and cosine to 10%, clip 1.0; rates {s['lrs']} per arm chosen on validation loss, a best rate
at either end of its sweep extended by the sweep's ratio up to {protocol.extend_edges} times (rates run:
{_rates_run(arms)}); seed {protocol.confirm_seeds[0]} held out.
MoE: experts of width 4d, capacity factor 1.25, load-balancing weight 0.01, router z-loss 0.001. FLOPs per token
C = 6 (N_active + n_layer T d).
Step time: one training step at batch {s['batch']}, arms interleaved over {s['time_rounds']} shuffled rounds,
median ratio to dense (both cores' load lands on every arm alike), and the range of the ratios over the rounds.

| arm | parameters | active (non-emb.) | MFLOPs/token | lr | test loss | minus dense | held-out seed | time / dense |
|---|---|---|---|---|---|---|---|---|
{rows}

{outcome_lines(outcomes)}

{edge_text(arms)}{_last_gain_text(arms)}

{held_out}

Reported beside the rule:
{reported}

**Regime.** Switch Transformers (Fedus et al. 2022) and Mixtral compare models of 10^8-10^11 parameters trained on
10^10-10^12 tokens, where each expert sees millions of tokens; here {s['steps'] * s['batch'] * s['context'] / 1e6:.1f}M
characters are shared by up to 16 experts per layer of a {s['n_layer']}-layer model on one small text, so each
expert sees a fraction of an epoch's tokens. Plot: `curves.png` (validation loss against training FLOPs, mean of
the 3 seeds at each arm's rate)."""


def _range(results: dict[str, Any], arm: str) -> str:
    """ "low-high" of an arm's per-round time ratios to dense."""
    low, high = results["time_ratio_range"][arm]
    return f"{low:.2f}-{high:.2f}"


def _rates_run(arms: dict[str, Any]) -> str:
    """The rates some arm was trained at, in order."""
    return ", ".join(f"{r:g}" for r in sorted({float(lr) for a in arms.values() for lr in a["by_lr"]}))


def _last_gain_text(arms: dict[str, Any]) -> str:
    """For arms chosen at the top of their sweep: how much the last rate changed validation loss, so a reader
    sees whether the optimum is near (a gain of ~0 says the curve has flattened) or still far."""
    gains = []
    for name, a in arms.items():
        rates = sorted(a["by_lr"], key=float)
        if a.get("at_sweep_edge") and len(rates) > 1 and f"{a['lr']:g}" == rates[-1]:
            before = a["by_lr"][rates[-2]]["val_loss"]["mean"]
            gains.append(f"{name} {a['val_loss']['mean'] - before:+.3f} ({rates[-2]} to {rates[-1]})")
    if not gains:
        return ""
    return " Validation loss changed by the last rate (negative: still improving): " + ", ".join(gains) + "."


def _held_out_text(arms: dict[str, Any], rules: list[Difference], outcomes: list[dict[str, Any]],
                   protocol: Protocol) -> str:
    """The held-out seed's own difference for each ruled arm (one seed: a check on the direction, not an
    interval), and whether its sign agrees with the mean difference the rule judged."""
    dense = arms["dense"]["confirmation"]["test_loss"]["values"][0]
    parts, agree = [], 0
    for rule, o in zip(rules, outcomes, strict=True):
        arm = rule.a
        diff = dense - arms[arm]["confirmation"]["test_loss"]["values"][0]  # > 0: the MoE is better
        agree += (diff > 0) == (o["difference"] > 0)
        parts.append(f"{arm} {diff:+.4f}")
    return (f"Held-out seed {protocol.confirm_seeds[0]} (not used to choose any rate), dense minus MoE test loss at "
            f"the chosen rates: {', '.join(parts)}; its sign agrees with the mean difference in {agree} of "
            f"{len(outcomes)}.")


def _plot(curves: dict[str, list[list[tuple[float, float]]]], arms: dict[str, Any], out: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for arm, runs in curves.items():
        flops = [f for f, _ in runs[0]]
        mean = [statistics.fmean(r[i][1] for r in runs) for i in range(len(flops))]
        ax.plot(flops, mean, "o-", ms=3, label=f"{arm} (lr {arms[arm]['lr']:g})")
    ax.set_xscale("log")
    label_axes(ax, "training FLOPs (6 N_active + attention, per token x tokens)", "validation loss (nats/char)",
               "loss against training compute, mean of 3 seeds", legend=7)
    save_figure(fig, out / "curves.png")
