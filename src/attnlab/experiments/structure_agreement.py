"""Causal tests of number agreement in a GPT trained on the nested or cross-serial grammar
(``experiments/grammars.py``): does the model's verb follow its noun, which head carries the noun's
number to the verb, and is the number linearly readable where the verb is predicted?

Inputs are controlled sentences of one depth d in {2, 3, 4} (``agreement_sentences``). For verb j the
position that predicts it is p = d + j (the token before the verb) and its noun sits at input position
1 + order[j]. Only *long-range* pairs count: the noun is not the token at p itself (the innermost pair of
a nested sentence is read off the current token and needs no attention). At p the model's number
preference is

    pref = log sum_{v in verbs of the noun's number} softmax(logits_p)_v - log sum_{v in the others} softmax(logits_p)_v

(> 0: it prefers the right number; the true model has pref = +inf). Measured per pair, pooled over depths:

- agreement accuracy   share of pairs with pref > 0;
- flip rate            the noun replaced by its other-number counterpart (dog -> dogs): share of pairs
                       whose preference, still taken for the *original* number, turns negative;
- the top head         the head with the largest attention weight from p to the noun, chosen on
                       validation sentences (never on the test sentences that score it);
- ablation share       (acc - acc with the head mean-ablated) / (acc - 0.5): how much of the agreement
                       above chance goes when that head's output is replaced by its mean;
- patch recovery       mean(pref_patched - pref_flipped) / mean(pref_clean - pref_flipped): the top head's
                       output patched from the clean sentence into the flipped one (intervene.patched);
- probe accuracy       a logistic-regression probe for the noun's number from the residual stream at p,
                       fit on one set of sentences and scored on another, at the embedding and after each
                       block.

The sentences are made on the CPU and the model runs on its own device (its parameters'): the inputs go there,
and the logits and activations that are scored come back to the CPU.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.experiments.grammars import agreement_sentences, counterpart, verb_ids
from attnlab.inspect.intervene import ablated, head, patched, run_with_cache
from attnlab.nn.hooks import capture

DEPTHS = (2, 3, 4)


def long_range_pairs(order: Tensor, depth: int) -> list[tuple[int, int, int]]:
    """(verb index j, predicting position p, noun position) for every verb whose noun is not the token at p."""
    return [(j, depth + j, 1 + int(i)) for j, i in enumerate(order.tolist()) if 1 + int(i) != depth + j]


def preference(logits: Tensor, plural: Tensor, verbs: dict[str, Tensor]) -> Tensor:
    """(n,) log P(verbs of the given number) - log P(verbs of the other number), from logits (n, V) at the
    predicting position and plural (n,) bool."""
    logp = F.log_softmax(logits.float(), dim=-1)
    pl, sg = logp[:, verbs["pl"]].logsumexp(-1), logp[:, verbs["sg"]].logsumexp(-1)
    return torch.where(plural, pl - sg, sg - pl)


def head_name(layer: int, index: int) -> str:
    """A head's name in the results: "L{layer}H{index}"."""
    return f"L{layer}H{index}"


def parse_head(name: str) -> tuple[int, int]:
    """(layer, index) of a head named "L{layer}H{index}"."""
    layer, index = name[1:].split("H")
    return int(layer), int(index)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _logits(model: nn.Module, ids: Tensor) -> Tensor:
    """The model's logits (n, T, V) for CPU ids, run on its device and brought back to the CPU."""
    return model(ids.to(_device(model))).logits.cpu()


def _heads(model: nn.Module) -> list[tuple[int, int]]:
    cfg = model.config
    return [(layer, h) for layer in range(cfg.n_layer) for h in range(cfg.n_head)]


@torch.no_grad()
def top_head(model: nn.Module, grammar: str, n: int, seed: int) -> tuple[str, dict[str, float]]:
    """The head with the largest mean attention weight from p to the noun over long-range pairs of ``n``
    sentences per depth (seed ``seed``): (its name "L{layer}H{head}", every head's weight)."""
    total, count = torch.zeros(model.config.n_layer, model.config.n_head), 0
    for depth in DEPTHS:
        s = agreement_sentences(grammar, depth, n, seed + depth)
        with capture(model, "blocks.*.mixer.hook_pattern") as seen:
            model(s["ids"].to(_device(model)))
        probs = torch.stack([p for p in seen.values()]).cpu()  # (L, n, H, T, T)
        for _, p, noun in long_range_pairs(s["order"], depth):
            total += probs[:, :, :, p, noun].sum(1)
            count += n
    weights = {head_name(layer, h): float(total[layer, h] / count) for layer, h in _heads(model)}
    return max(weights, key=weights.get), weights


@torch.no_grad()
def causal_tests(model: nn.Module, grammar: str, top: str, n: int, seed: int) -> dict[str, Any]:
    """Agreement accuracy, flip rate, every head's ablation share and the top head's patch recovery, on
    ``n`` test sentences per depth."""
    verbs, swap = verb_ids(grammar), counterpart(grammar)
    top_site = head(*parse_head(top))
    clean, flipped, patched_pref = [], [], []
    ablation: dict[str, list[Tensor]] = {head_name(layer, h): [] for layer, h in _heads(model)}
    for depth in DEPTHS:
        s = agreement_sentences(grammar, depth, n, seed + depth)
        out, cache = run_with_cache(model, s["ids"].to(_device(model)), "blocks.*.mixer.hook_z")
        clean_logits = out.logits.cpu()
        pairs = long_range_pairs(s["order"], depth)
        for name in ablation:
            with ablated(model, [head(*parse_head(name))], how="mean", reference=cache):
                logits = _logits(model, s["ids"])
            ablation[name] += [preference(logits[:, p], s["plural"][:, s["order"][j]], verbs) for j, p, _ in pairs]
        for j, p, noun in pairs:
            plural = s["plural"][:, s["order"][j]]
            ids = s["ids"].clone()
            ids[:, noun] = swap[ids[:, noun]]
            clean.append(preference(clean_logits[:, p], plural, verbs))
            flipped.append(preference(_logits(model, ids)[:, p], plural, verbs))
            with patched(model, [top_site], cache):
                patched_pref.append(preference(_logits(model, ids)[:, p], plural, verbs))
    clean_t, flipped_t, patched_t = torch.cat(clean), torch.cat(flipped), torch.cat(patched_pref)
    accuracy = float((clean_t > 0).float().mean())
    shares = {name: (accuracy - float((torch.cat(p) > 0).float().mean())) / max(accuracy - 0.5, 1e-9)
              for name, p in ablation.items()}
    others = [v for k, v in shares.items() if k != top]
    return {"agreement_accuracy": accuracy, "flip_rate": float((flipped_t < 0).float().mean()),
            "mean_preference": float(clean_t.mean()), "n_pairs": len(clean_t), "ablation_shares": shares,
            "top_head_ablation_share": shares[top], "other_heads_max_ablation_share": max(others),
            "top_head_patch_recovered": float((patched_t - flipped_t).mean() / (clean_t - flipped_t).mean())}


@torch.no_grad()
def number_probe(model: nn.Module, grammar: str, n: int, seeds: tuple[int, int]) -> dict[str, float]:
    """Held-out accuracy of a logistic-regression probe for the noun's number at p, from the residual stream
    at the embedding ("embedding") and after each block ("block {i}"); fit on sentences of ``seeds[0]``,
    scored on those of ``seeds[1]``."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    points = {"embedding": "blocks.0.hook_resid_pre",
              **{f"block {i}": f"blocks.{i}.hook_resid_post" for i in range(model.config.n_layer)}}
    data: list[dict[str, tuple[np.ndarray, np.ndarray]]] = []
    for seed in seeds:
        feats: dict[str, list[Tensor]] = {k: [] for k in points}
        labels: list[Tensor] = []
        for depth in DEPTHS:
            s = agreement_sentences(grammar, depth, n, seed + depth)
            _, cache = run_with_cache(model, s["ids"].to(_device(model)), list(points.values()))
            for j, p, _ in long_range_pairs(s["order"], depth):
                labels.append(s["plural"][:, s["order"][j]])
                for k, point in points.items():
                    feats[k].append(cache[point][:, p].cpu())
        y = torch.cat(labels).numpy()
        data.append({k: (torch.cat(v).numpy(), y) for k, v in feats.items()})
    accuracy = {}
    for k in points:
        (x_fit, y_fit), (x_test, y_test) = data[0][k], data[1][k]
        probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(x_fit, y_fit)
        accuracy[k] = float((probe.predict(x_test) == y_test).mean())
    return accuracy


def agreement_report(model: nn.Module, grammar: str, n: int, seed: int) -> dict[str, Any]:
    """Everything above for one trained model: the top head chosen on validation sentences (seed), the causal
    tests on test sentences (seed + 100), the probe fit on seed + 200 and scored on seed + 300."""
    model.eval()
    top, weights = top_head(model, grammar, n, seed)
    tests = causal_tests(model, grammar, top, n, seed + 100)
    probe = number_probe(model, grammar, n, (seed + 200, seed + 300))
    return {"top_head": top, "top_head_attention": weights[top], "head_attention": weights, **tests,
            "probe": probe, "probe_final": probe[f"block {model.config.n_layer - 1}"],
            "probe_embedding": probe["embedding"]}
