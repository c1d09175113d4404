"""The logit lens (nostalgebraist 2020): read the residual stream of every layer as if it were the last.

    r_0 = the embeddings (the stream entering block 0),  r_l = the stream leaving block l-1
    logits_l = Unembed(FinalNorm(r_l))        (B, T, V),  l = 0 .. L;  logits_L are the model's own

For each layer: the next-token loss against the targets (how much of the prediction is already
there) and the top tokens at each position; as a grid (``logit_lens_grid``), position x layer, the top
token of softmax(logits_l) and its probability. Read from the hook points ``blocks.{i}.hook_resid_pre``
and the last ``hook_resid_post`` (``attnlab.nn.hooks``), for a pre-norm GPT whose blocks carry the
stream themselves (a model-level residual scheme keeps several streams: refused).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.core.errors import ConfigError
from attnlab.nn.hooks import capture


@dataclass
class LensResult:
    """layers[l] names r_l ("embed", "block 0", ...); loss[l]: mean next-token cross-entropy of logits_l
    (None without targets); top[l]: (B, T, k) token ids of the k largest logits_l; logits: (L+1, B, T, V)."""

    layers: list[str]
    logits: Tensor
    top: Tensor
    loss: list[float] | None


def _streams(model: nn.Module, idx: Tensor) -> list[Tensor]:
    """r_0 .. r_L (module docstring), each (B, T, C), from one forward pass."""
    config = model.config
    if config.family != "gpt" or getattr(model, "residual", None) is not None:
        raise ConfigError("the logit lens reads one residual stream: a gpt with residual=standard")
    L = config.n_layer
    with capture(model, "blocks.*.hook_resid_pre", f"blocks.{L - 1}.hook_resid_post") as seen:
        model(idx, last_only=True)  # the streams are what is read; the model's own logits are logits_L
    return [seen[f"blocks.{i}.hook_resid_pre"] for i in range(L)] + [seen[f"blocks.{L - 1}.hook_resid_post"]]


def layer_names(n_layer: int) -> list[str]:
    """The names of r_0 .. r_L: "embed", "block 0", ..."""
    return ["embed", *[f"block {i}" for i in range(n_layer)]]


@torch.no_grad()
def logit_lens(model: nn.Module, idx: Tensor, targets: Tensor | None = None, k: int = 5) -> LensResult:
    """The logit lens of a GPT on token ids idx (B, T) (see the module docstring)."""
    logits = torch.stack([model.head(model.norm_f(r)) for r in _streams(model, idx)])  # (L+1, B, T, V)
    loss = None
    if targets is not None:
        loss = [F.cross_entropy(lg.reshape(-1, lg.size(-1)), targets.reshape(-1), ignore_index=-100).item()
                for lg in logits]
    return LensResult(layer_names(model.config.n_layer), logits, logits.topk(k, dim=-1).indices, loss)


@torch.no_grad()
def logit_lens_grid(model: nn.Module, idx: Tensor, rows: int = 256) -> tuple[Tensor, Tensor]:
    """The logit lens as a grid: at each layer l and position t the most likely next token of
    softmax(logits_l) and its probability, (top ids (L+1, B, T), p (L+1, B, T)), with
    p = exp(max(z) - logsumexp(z)). The logits are formed ``rows`` positions at a time, (rows, V)."""
    top, p = [], []
    for r in _streams(model, idx):
        best = [(z.max(dim=-1), z.logsumexp(dim=-1)) for z in (model.head(model.norm_f(chunk))  # (rows, V)
                                                                for chunk in r.reshape(-1, r.size(-1)).split(rows))]
        top.append(torch.cat([m.indices for m, _ in best]).view(r.shape[:-1]))  # (B, T)
        p.append(torch.cat([(m.values - lse).exp() for m, lse in best]).view(r.shape[:-1]))
    return torch.stack(top), torch.stack(p)


def grid_rows(tok, ids: list[int], top: Tensor, p: Tensor) -> list[dict]:
    """One row per position of a grid for one text (top, p: (L+1, T)): {"token", "top": [{"token", "p"} per
    layer]}, what the reports and the explorer show."""
    return [{"token": tok.decode([ids[t]]),
             "top": [{"token": tok.decode([int(top[layer, t])]), "p": round(float(p[layer, t]), 4)}
                     for layer in range(top.size(0))]}
            for t in range(len(ids))]


def _gpt_and_ids(run_dir, text: str, min_tokens: int = 2, model=None):
    """A run's GPT (eval mode) and ``text`` as ids (1, T); one-line errors for anything else.
    ``model``: a (model, tokenizer) already loaded from the run."""
    from attnlab.tokenizers.specials import encode_for
    from attnlab.training.runs import load_model_and_tokenizer

    model, tok = model or load_model_and_tokenizer(run_dir)
    if model.config.family != "gpt":
        raise ConfigError(f"{run_dir} holds a {model.config.family} model; the lens commands read a gpt")
    ids = encode_for(model, tok, text)  # the one text encoding (a gpt's: the bare text)
    if len(ids) < min_tokens:
        raise ConfigError("give --text of at least two tokens (the lens scores each next token)"
                          if min_tokens == 2 else "give a text of at least one token")
    if len(ids) > model.config.block_size:
        raise ConfigError(f"the text has {len(ids)} tokens, more than the context of {model.config.block_size}")
    return model.eval(), tok, torch.tensor([ids])


def lens_report(run_dir, text: str, k: int = 5) -> dict:
    """The logit lens of a run on ``text``: per layer the next-token loss over the text and, at each
    position (the last one included: what would follow the text), the k most likely next tokens."""
    model, tok, idx = _gpt_and_ids(run_dir, text)
    if k > model.config.vocab_size:
        raise ConfigError(f"--k {k} is more than the {model.config.vocab_size} tokens of this model's vocabulary")
    targets = torch.cat([idx[:, 1:], torch.full((1, 1), -100)], dim=1)  # nothing to score after the text
    lens = logit_lens(model, idx, targets, k=k)
    best = lens.logits[:, 0].softmax(dim=-1).max(dim=-1)  # (L+1, T)
    return {"text": text, "tokens": [tok.decode([i]) for i in idx[0].tolist()],
            "layers": [{"name": name, "loss": loss, "top": [[tok.decode([t]) for t in row] for row in top[0].tolist()]}
                       for name, loss, top in zip(lens.layers, lens.loss, lens.top, strict=True)],
            "grid": grid_rows(tok, idx[0].tolist(), best.indices, best.values)}


def check_heads(model: nn.Module, heads: list[tuple[int, int]], what: str = "--head") -> None:
    """One line naming the bounds when a (layer, head) is outside the model."""
    c = model.config
    bad = [(layer, h) for layer, h in heads if not (0 <= layer < c.n_layer and 0 <= h < c.n_head)]
    if bad:
        raise ConfigError(f"{what} takes LAYER.HEAD with layer < {c.n_layer} and head < {c.n_head}; got {bad}")


@torch.no_grad()
def ablation_on(model: nn.Module, tok, idx: Tensor, heads: list[tuple[int, int]], how: str = "zero",
                k: int = 5) -> dict:
    """Next-token loss over idx (1, T) (None for one token) and the top-k next tokens after it, plain and
    with the (layer, head)s ablated ("mean": each head's mean over the text's own positions); no heads:
    "ablated" is None."""
    from attnlab.inspect.intervene import ablated, head, run_with_cache

    if how not in ("zero", "mean"):
        raise ConfigError(f"ablate by 'zero' or 'mean', not {how!r}")
    check_heads(model, heads)
    cache = run_with_cache(model, idx, "blocks.*.mixer.hook_z")[1] if how == "mean" and heads else None

    def measure() -> dict:
        loss = model(idx[:, :-1], targets=idx[:, 1:]).loss.item() if idx.size(1) > 1 else None
        p, t = model(idx).logits[0, -1].softmax(-1).topk(k)
        return {"loss": loss, "next": [[tok.decode([i]), round(v, 4)] for v, i in zip(p.tolist(), t.tolist(),
                                                                                    strict=True)]}

    plain = measure()
    if not heads:
        return {"heads": [], "how": how, "plain": plain, "ablated": None, "loss_increase": None}
    with ablated(model, [head(layer, h) for layer, h in heads], how=how, reference=cache):
        changed = measure()
    rise = None if plain["loss"] is None else changed["loss"] - plain["loss"]
    return {"heads": [f"L{layer}H{h}" for layer, h in heads], "how": how, "plain": plain, "ablated": changed,
            "loss_increase": rise}


def ablation_report(run_dir, text: str, heads: list[tuple[int, int]], how: str = "zero", k: int = 5) -> dict:
    """``ablation_on`` for a run and a text of at least two tokens; at least one head."""
    model, tok, idx = _gpt_and_ids(run_dir, text)
    if not heads:
        raise ConfigError("give at least one --head LAYER.HEAD")
    return {"text": text, **ablation_on(model, tok, idx, heads, how, k)}


@torch.no_grad()
def explorer_view(model: nn.Module, tok, ids: list[int], heads: list[tuple[int, int]], how: str = "zero",
                  k: int = 10) -> dict:
    """What the explorer's lens tab shows for token ids: the logit lens at the position after the text
    (each layer's top-k with probabilities, and its loss over the text), the grid (``grid_rows``: each
    position's top token at each layer) and the next-token distribution, plain and with the heads ablated."""
    idx = torch.tensor([ids])
    targets = torch.cat([idx[:, 1:], torch.full((1, 1), -100)], dim=1)
    lens = logit_lens(model, idx, targets if len(ids) > 1 else None, k=k)
    best = lens.logits[:, 0].softmax(dim=-1).max(dim=-1)  # (L+1, T): the grid
    probs = lens.logits[:, 0, -1].softmax(-1)  # (L+1, V) after the text
    layers = []
    for i, name in enumerate(lens.layers):
        p, t = probs[i].topk(k)
        layers.append({"name": name, "loss": None if lens.loss is None else lens.loss[i],
                       "top": [{"token": tok.decode([j]), "p": round(v, 4)} for v, j in zip(p.tolist(), t.tolist(),
                                                                                           strict=True)]})
    ab = ablation_on(model, tok, idx, heads, how, k)

    def bars(r: dict | None) -> list[dict] | None:
        return None if r is None else [{"token": token, "p": p} for token, p in r["next"]]

    return {"tokens": [tok.decode([i]) for i in ids], "layers": layers,
            "grid": grid_rows(tok, ids, best.indices, best.values), "heads": ab["heads"], "how": how,
            "next_token": bars(ab["plain"]), "ablated_next_token": bars(ab["ablated"]),
            "loss": ab["plain"]["loss"], "ablated_loss": None if ab["ablated"] is None else ab["ablated"]["loss"]}


def _one_token(tok, text: str, what: str) -> int:
    ids = tok.encode(text)
    if len(ids) != 1:
        raise ConfigError(f"{what} {text!r} is {len(ids)} tokens for this tokenizer; give one token")
    return ids[0]


def dla_report(run_dir, text: str, answer: str, wrong: str | None = None, top: int = 10) -> dict:
    """Direct logit attribution of the next token after ``text``: each head's, MLP's and the embeddings'
    direct share of logit(answer) (- logit(wrong)), ranked by size (``inspect.circuits``)."""
    from attnlab.inspect.circuits import direct_logit_attribution

    model, tok, idx = _gpt_and_ids(run_dir, text, min_tokens=1)
    a = _one_token(tok, answer, "--answer")
    w = None if wrong is None else _one_token(tok, wrong, "--wrong")
    attr = direct_logit_attribution(model, idx, a, w)
    ranked = attr.ranked()
    return {"text": text, "answer": answer, "wrong": wrong, "total": float(attr.total[0]),
            "parts": [{"name": n, "value": v} for n, v in ranked], "shown": min(top, len(ranked))}


def patch_report(run_dir, clean: str, corrupted: str, answer: str, wrong: str,
                 paths: list[tuple[tuple[int, int], list[tuple[int, int]]]] = (), through_mlps: bool = True) -> dict:
    """Activation patching from the run on ``clean`` into the run on ``corrupted`` (same token count),
    metric logit(answer) - logit(wrong) after the text: the recovered fraction for the residual stream
    at each layer and position, for each head, and for each sender -> receiver head path."""
    from attnlab.inspect.circuits import path_patch
    from attnlab.inspect.intervene import head, logit_difference, patch_recovery, residual_patching, run_with_cache

    model, tok, x_clean = _gpt_and_ids(run_dir, clean, min_tokens=1)
    x_corr = _gpt_and_ids(run_dir, corrupted, min_tokens=1, model=(model, tok))[2]
    if x_clean.shape != x_corr.shape:
        raise ConfigError(f"--clean is {x_clean.size(1)} tokens and --corrupted {x_corr.size(1)}: patching "
                          "lines positions up, so give texts of the same token count")
    c = model.config
    bad = [(layer, h) for s, rs in paths for (layer, h) in (s, *rs)
           if not (0 <= layer < c.n_layer and 0 <= h < c.n_head)]
    if bad:
        raise ConfigError(f"--path heads need layer < {c.n_layer} and head < {c.n_head}; got {bad}")
    backward = [f"{s[0]}.{s[1]}>{r[0]}.{r[1]}" for s, rs in paths for r in rs if s[0] >= r[0]]
    if backward:
        raise ConfigError(f"--path {backward[0]}: the sender must sit in an earlier layer than the receiver")
    a, w = _one_token(tok, answer, "--answer"), _one_token(tok, wrong, "--wrong")
    if a == w:
        raise ConfigError("--answer and --wrong are the same token: their logit difference is always 0")
    metric = logit_difference(a, w)
    base = patch_recovery(model, x_clean, x_corr, [], metric)
    if base.clean == base.corrupted:
        raise ConfigError("the clean and corrupted texts give the same logit difference: there is nothing to recover")
    T = x_clean.size(1)
    grid = residual_patching(model, x_clean, x_corr, metric, c.n_layer, T)
    _, cache = run_with_cache(model, x_clean, "blocks.*.mixer.hook_z")
    heads = [[patch_recovery(model, x_clean, x_corr, [head(layer, h)], metric, clean_cache=cache).recovered
              for h in range(c.n_head)] for layer in range(c.n_layer)]
    path_rows = [{"sender": f"L{s[0]}H{s[1]}", "receivers": [f"L{r[0]}H{r[1]}" for r in rs],
                  "recovered": path_patch(model, x_clean, x_corr, head(*s), [head(*r) for r in rs], metric,
                                          through_mlps).recovered}
                 for s, rs in paths]
    layers = [patch_recovery(model, x_clean, x_corr, [head(layer, h) for h in range(c.n_head)], metric,
                             clean_cache=cache).recovered for layer in range(c.n_layer)]
    return {"clean": clean, "corrupted": corrupted, "answer": answer, "wrong": wrong, "all_heads_of_layer": layers,
            "paths_through_mlps": through_mlps,
            "tokens": [tok.decode([i]) for i in x_corr[0].tolist()],
            "metric_clean": base.clean, "metric_corrupted": base.corrupted,
            "resid_pre": grid.tolist(), "heads": heads, "paths": path_rows}
