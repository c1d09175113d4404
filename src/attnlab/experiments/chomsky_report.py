"""The chomsky experiment's report and plots, rendered from its results (``attnlab.experiments.chomsky``
trains, tests and decides the verdict; this module only writes it up)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.data.formal import TASKS
from attnlab.experiments.base import pyplot, save_figure
from attnlab.experiments.chomsky_protocol import (
    FAMILIES,
    PAPER_SOURCE,
    PAPER_TABLE2,
    QUOTED,
    REPRINTED,
    SOLVED,
    TRAIN_MAX_LENGTH,
    TRANSFORMERS,
)
from attnlab.experiments.study import HELD, NOT_HELD, UNDECIDED, edge_text, verdict_of
from attnlab.experiments.verdicts import family_interval, refutes


def _pct(summary: dict[str, Any]) -> str:
    return f"{100 * summary['mean']:.1f} ± {100 * summary['sd']:.1f}"


def _paper(task: str, fam: str) -> str:
    value = PAPER_TABLE2.get(task, {}).get(fam)
    marks = ("q" if (task, fam) in QUOTED else "") + ("r" if (task, fam) in REPRINTED else "")
    return "–" if value is None else f"{value:.1f}{' ' + marks if marks else ''}"


def report(r: dict[str, Any], s: dict[str, Any]) -> str:
    """The body of report.md: the rule, the setup, the tables (ours with the paper's beside), the outcomes."""
    tasks = r["tasks"]
    names = list(tasks)
    schemes = [m for m in s["models"] if m in TRANSFORMERS]

    def ours(t: str, fam: str) -> str:
        m = tasks[t]["chosen"].get(fam)
        if m is None:
            return "–"
        a = tasks[t]["arms"][m]
        held_out = a.get("confirmation", {}).get("test_score", {}).get("values", [])
        cell = _pct(a["test_score"]) + (f" [{100 * held_out[0]:.1f}]" if held_out else "")
        return cell + (f" ({m.removeprefix('tf-')})" if fam == "transformer" else "")

    def floor(t: str) -> str:
        base = tasks[t]["majority_baseline"]
        return f"{100 * tasks[t]['chance']:.0f}" + ("" if base is None else f" / {100 * base:.1f}")

    main = "\n".join(f"| {t} | {tasks[t]['level']} | {floor(t)} | " + " | ".join(ours(t, f) for f in FAMILIES)
                     + " | " + " | ".join(_paper(t, f) for f in FAMILIES) + " |" for t in names)

    def best(t: str, fam: str) -> str:
        b = tasks[t]["best_of"].get(fam)
        if b is None:
            return "–"
        return f"{100 * b['test_score']:.1f}" + (f" ({b['model'].removeprefix('tf-')})" if fam == "transformer"
                                                 else "") + f", of {b['of']}"

    best_rows = "\n".join(f"| {t} | " + " | ".join(best(t, f) for f in FAMILIES) + " | "
                          + " | ".join(_paper(t, f) for f in FAMILIES) + " |" for t in names)
    scheme_rows = "\n".join(
        f"| {t} | " + " | ".join(f"{_pct(tasks[t]['arms'][m]['test_score'])} / {_pct(tasks[t]['arms'][m]['val_score'])}"
                                 f" ({tasks[t]['arms'][m]['lr']:g})" for m in schemes) + " |" for t in names)
    def stops(a: dict[str, Any]) -> str:  # how the chosen setting's seeds stopped: fitted / plateau / budget
        n = a["steps"]["n"]
        fitted, flat = round(a["fitted"]["mean"] * n), round(a["plateau"]["mean"] * n)
        return f"{fitted}/{flat}/{n - fitted - flat}"

    fit_rows = "\n".join(
        f"| {t} | " + " | ".join(f"{100 * tasks[t]['arms'][m]['train_range_accuracy']['mean']:.1f} "
                                 f"({tasks[t]['arms'][m]['steps']['mean']:.0f}; {stops(tasks[t]['arms'][m])})"
                                 for m in s["models"]) + " |" for t in names)
    notes = []
    if "missing_duplicate_string" in tasks and any(tasks["missing_duplicate_string"]["arms"][m]["test_score"]["mean"]
                                                   > SOLVED for m in s["models"]):
        notes.append("missing_duplicate_string has a finite-state shortcut: w w holds an even number of 1s, so the "
                     "missing symbol is the parity of the visible 1s; a model that solves parity solves it.")
    steps, lengths = s["steps"], next(iter(tasks.values()))["test_lengths"]
    return f"""**Verdict rule, fixed before the run.** For each regular task, the RNN's and the LSTM's mean test
score is above {100 * SOLVED:.0f}%; for each non-regular task, the RNN's and the Transformer's is below it; each
decided on the 95% t interval of the mean over seeds 0-2 at the model's chosen setting (held if the interval
lies wholly on the claimed side, not held if wholly on the other, else not decidable). A low score decides
only from a model that stopped learning: where a seed ended at its step budget while still improving (neither
fitted nor on a plateau), the part a low score would decide is not decidable instead. The claim holds if every
part holds, and is not held if some part's interval at the family-wise level 1 - 0.05/K (Bonferroni over its K
judged parts) lies wholly on the other side of {100 * SOLVED:.0f}%; else it is not decidable. The paper's numbers
decide nothing. (The guard, the transformer's budget past its first possible plateau and the extension of edge
rates were set after a first start that was stopped after one task, even pairs, a regular task on which the
Transformer is not judged, and before any judged part of it had run. The family-wise level replaced "not held
once any part is not held at 95%" while this run was under way, with 11 of its 15 tasks kept: it is the rule of
every attnlab experiment since, `experiments/verdicts.py`; the tally below gives the verdict under both.)

**Setup.** The {len(names)} tasks of Delétang et al. (2023) (`attnlab.data.formal`). Training: input lengths
uniform in 1..{TRAIN_MAX_LENGTH} per batch of {s['batch']}, Adam, {s['schedule']} rate, gradient clip
{s['clip']}, at most {steps['rnn']} (RNN) / {steps['lstm']} (LSTM) / {steps['transformer']} (transformer)
steps, checking the accuracy on fixed strings of lengths 10-40 every {s['check_every']} steps and stopping once
it reaches {100 * s['fit_target']:.1f}% (fitted) or once {s['patience']} checks in a row gain less than
{s['min_gain']:g} over the best before them (a plateau). RNN and LSTM: hidden {s['hidden']}; transformer
encoder: d_model {s['d_model']}, {s['n_layer']} layers, {s['n_head']} heads, one arm per positional scheme
({', '.join(m.removeprefix('tf-') for m in schemes)}). Every model: rates {s['lrs']} with seeds 0-2 (and
{_extension(s)}), the rate chosen on the mean validation score (fresh strings at the test lengths,
{s['val_strings']['single']} per length for one-token outputs, {s['val_strings']['sequence']} for sequences);
the Transformer's scheme chosen the same way. Test: other fresh strings, {s['eval_strings']['single']} /
{s['eval_strings']['sequence']} per length, at lengths {lengths}; the chosen setting also ran with held-out seed 3.

Test score in % (mean ± sd over seeds 0-2 at the chosen setting; held-out seed 3 in brackets; the
Transformer's chosen scheme in parentheses). Floor: chance / the position-blind majority baseline of the copy
tasks. Paper: {PAPER_SOURCE}.

| task | level | floor | RNN | LSTM | Transformer | paper RNN | paper LSTM | paper Transformer |
|---|---|---|---|---|---|---|---|---|
{main}

{verdict_table(r['outcomes'], tasks)}

**Best single run, beside.** The paper reports its best run, selected on the test score over seeds, rates and
(for the Transformer) encodings. The same selection over our runs (seeds 0-2 × rates [× schemes]; "of N" runs)
is shown here for comparison only: it is a maximum, not a mean, and decides nothing.

| task | RNN best | LSTM best | Transformer best | paper RNN | paper LSTM | paper Transformer |
|---|---|---|---|---|---|---|
{best_rows}

Every transformer scheme, test / validation score (chosen rate):

| task | {' | '.join(m.removeprefix('tf-') for m in schemes)} |
|---|{'---|' * len(schemes)}
{scheme_rows}

Fit of the training lengths (accuracy % on lengths 10-40, mean over seeds), mean steps trained, and how the
seeds stopped (fitted / plateau / budget):

| task | {' | '.join(s['models'])} |
|---|{'---|' * len(s['models'])}
{fit_rows}

**Reading.** The score measures generalisation to lengths never seen in training, not fit: compare the fit
table. {_against_paper(tasks)}
{' '.join(notes)} {_edges(tasks)}

**Regime.** The paper trains each model far longer (recalled, not verified here: 1,000,000 steps at batch 128)
and sweeps more rates and seeds; here each run has at most {max(steps.values()):,} steps on one CPU thread,
so a model that would generalise only after long training can score low here (the guard above keeps such a
score from deciding while the model was still improving). The models are small (see results.json for
parameter counts). Plots: `scores.png` (mean test score, task × model) and `by_length.png` (accuracy against
test length)."""


def verdict_table(outcomes: list[dict[str, Any]], tasks: dict[str, dict[str, Any]]) -> str:
    """The outcome of every part of the rule as one table (task x family: verdict, mean test score and its 95%
    interval in %; "–" where the family is not judged on that task) and a tally naming the parts that were not
    held or not decidable. The rule itself is stated once, above; results.json keeps each outcome's rule."""
    by_part = {o["arm"]: o for o in outcomes}

    def cell(t: str, fam: str) -> str:
        o = by_part.get(f"{fam}@{t}")
        if o is None:
            return "–"
        low, high = o["interval"]
        still = o.get("still_learning", 0)
        guard = f" ({still} seed{'s' if still > 1 else ''} still learning)" if o["verdict"] == UNDECIDED and still \
            else ""
        return f"**{o['verdict']}**{guard}: {100 * o['mean']:.1f} [{100 * low:.1f}, {100 * high:.1f}]"

    rows = "\n".join(f"| {t} | {tasks[t]['level']} | " + " | ".join(cell(t, f) for f in FAMILIES) + " |"
                     for t in tasks)
    count = {v: [o["arm"].replace("@", " on ") for o in outcomes if o["verdict"] == v]
             for v in (HELD, NOT_HELD, UNDECIDED)}
    tally = f"{len(count[HELD])} of {len(outcomes)} parts held"
    for v, name in ((NOT_HELD, "not held at 95%"), (UNDECIDED, UNDECIDED)):
        if count[v]:
            tally += f"; {name}: {', '.join(count[v])}"
    if count[NOT_HELD]:
        tally += ". " + _family_wise(outcomes)
    decided = [o for o in outcomes if o["verdict"] != UNDECIDED]
    against = [o["arm"].replace("@", " on ") for o in decided if not _seed_agrees(o, tasks)]
    seeds = (f"The held-out seed 3, at each model's chosen setting, falls on the same side of {100 * SOLVED:.0f}% "
             f"as the mean in {len(decided) - len(against)} of the {len(decided)} decided parts"
             + (f"; not in: {', '.join(against)}" if against else "") + " (shown beside, it decides nothing).")
    return f"""Outcome of each part of the rule (mean test score in %, its 95% interval; "–": not judged there):

| task | level | RNN | LSTM | Transformer |
|---|---|---|---|---|
{rows}

{tally}. {seeds}"""


def _family_wise(outcomes: list[dict[str, Any]]) -> str:
    """The parts not held at 95% seen at the family-wise level 1 - 0.05/K (``verdicts.refutes``): which still
    miss the bound there, with their widened intervals in %, and the verdict under the earlier combination (not
    held once any part is not held at 95%)."""
    k = len(outcomes)

    def widened(o: dict[str, Any]) -> str:
        interval = family_interval(o, k)
        if interval is None:
            return ""
        sign = -1.0 if o["family"]["threshold"] < 0 else 1.0  # "below 90%" is kept as -score > -0.9
        low, high = sorted(100 * sign * v for v in interval)
        return f" [{low:.1f}, {high:.1f}]"

    missed = [o for o in outcomes if o["verdict"] == NOT_HELD]
    refuting = [f"{o['arm'].replace('@', ' on ')}{widened(o)}" for o in missed if refutes(o, k)]
    reaching = [f"{o['arm'].replace('@', ' on ')}{widened(o)}" for o in missed if not refutes(o, k)]
    text = f"At the family-wise level 1 - 0.05/{k}: "
    text += (f"still wholly on the wrong side of {100 * SOLVED:.0f}%: {', '.join(refuting)}" if refuting
             else f"none is still wholly on the wrong side of {100 * SOLVED:.0f}%")
    if reaching:
        text += f"; reaching {100 * SOLVED:.0f}%: {', '.join(reaching)}"
    return text + (f". Verdict: {verdict_of(outcomes)}; under the earlier combination: {NOT_HELD}")


def _against_paper(tasks: dict[str, dict[str, Any]]) -> str:
    """The chosen models whose mean test score falls on the other side of 90% from the paper's table, both ways
    (each family, judged or not; the paper's cells are its best runs, ours means over seeds)."""
    sides: dict[bool, list[str]] = {True: [], False: []}
    for t, task in tasks.items():
        for f, m in task["chosen"].items():
            ours, paper = task["arms"][m]["test_score"]["mean"] > SOLVED, PAPER_TABLE2[t][f] > 100 * SOLVED
            if ours != paper:
                sides[ours].append(f"{f} on {t} ({100 * task['arms'][m]['test_score']['mean']:.1f} vs "
                                   f"{PAPER_TABLE2[t][f]:.1f})")
    bound = f"{100 * SOLVED:.0f}%"
    return (f"Above {bound} where the paper's table is below it: {', '.join(sides[True]) or 'none'}. Below "
            f"{bound} where the paper's table is above it: {', '.join(sides[False]) or 'none'}.")


def _seed_agrees(o: dict[str, Any], tasks: dict[str, dict[str, Any]]) -> bool:
    """Whether the held-out seed's test score lies on the same side of the bound as the outcome's mean (True
    where no held-out seed ran)."""
    fam, task = o["arm"].split("@")
    arm = tasks[task]["arms"][tasks[task]["chosen"][fam]]
    held_out = arm.get("confirmation", {}).get("test_score", {}).get("values", [])
    return not held_out or (held_out[0] > SOLVED) == (o["mean"] > SOLVED)


def _extension(s: dict[str, Any]) -> str:
    """How far a sweep is extended where the better rate is an edge, in words."""
    n = s.get("extend_edges", 0)
    if not n:
        return "no rate beyond them"
    return ("one more rate past the edge, the sweep's ratio, where the better of them is an edge and not tied"
            if n == 1 else f"up to {n} more rates past an edge, the sweep's ratio, while the best is an edge")


def _edges(tasks: dict[str, dict[str, Any]]) -> str:
    """The chosen settings still at an edge of their (extended) sweep, per task (``study.edge_text``)."""
    return edge_text({f"{m} on {t}": a for t in tasks for m, a in tasks[t]["arms"].items()})


def plot(tasks: dict[str, dict[str, Any]], s: dict[str, Any], out: Path) -> None:
    """scores.png (task x model heatmap of mean test scores) and by_length.png (accuracy vs test length)."""
    plt = pyplot()
    names, models = list(tasks), list(s["models"])
    grid = [[100 * tasks[t]["arms"][m]["test_score"]["mean"] for m in models] for t in names]
    fig, ax = plt.subplots(figsize=(2.6 + 0.9 * len(models), 1.2 + 0.38 * len(names)))
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(models)), models, rotation=35, ha="right", fontsize=8)
    ax.set_yticks(range(len(names)), [f"{t} ({TASKS[t].level})" for t in names], fontsize=8)
    for i, row in enumerate(grid):
        for j, val in enumerate(row):
            ax.text(j, i, f"{val:.0f}", ha="center", va="center", fontsize=7, color="white" if val < 60 else "black")
    fig.colorbar(im, ax=ax, label="mean test score (%)")
    ax.set_title("length generalisation (trained on lengths 1-40), mean of 3 seeds", fontsize=10)
    save_figure(fig, out / "scores.png")
    shown = [t for t in ("parity_check", "reverse_string", "bucket_sort", "duplicate_string") if t in names][:4]
    shown = shown or names[:4]
    fig, axes = plt.subplots(1, len(shown) + 1, figsize=(3.6 * len(shown) + 1.8, 3.2), squeeze=False,
                             gridspec_kw={"width_ratios": [1] * len(shown) + [0.45]})
    for ax, t in zip(axes[0], shown):
        for fam, m in tasks[t]["chosen"].items():
            ax.plot(tasks[t]["test_lengths"], tasks[t]["curves"][m], "o-", ms=3, label=fam)
        ax.axhline(TASKS[t].chance, color="grey", ls="--", lw=1)
        ax.set_ylim(0, 1.02)
        scheme = tasks[t]["chosen"].get("transformer", "")
        ax.set_title(f"{t}" + (f" (transformer: {scheme.removeprefix('tf-')})" if scheme else ""), fontsize=8)
        ax.set_xlabel("input length")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("per-token accuracy (mean of seeds)")
    axes[0][-1].axis("off")  # the legend's own panel, so it hides no curve
    axes[0][-1].legend(*axes[0][0].get_legend_handles_labels(), fontsize=7, loc="center left")
    save_figure(fig, out / "by_length.png")
