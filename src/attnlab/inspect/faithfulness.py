"""Which explanation tells the truth about this model on this input? Attributions scored by deletion
and insertion curves (Petsiuk et al. 2018; Samek et al. 2017).

Every method explains the same function. An input has N features (the content tokens of a text, the
patches of an image), switched on or off by a presence vector z in [0, 1]^N:

    e_i(z) = z_i e_i + (1 - z_i) e'_i          e_i: the embedding of token / patch i, e': a baseline's
                                               (token: the [MASK]/[PAD]/given id; patch: the mean image)
    f(z)   = the model's logit of the target class (or next token) with embeddings e(z)

so z = 1 is the input, z = 0 the baseline, and z_i = 0 removes feature i. (The patch embedding is
affine, so mixing its outputs is mixing the pixels.) The methods, each a score per feature:

    attention              the last layer's head-averaged attention of the query that decides (the [CLS]
                           row, the mean patch row for mean pooling, the last position for a GPT)
    rollout                the same row of the attention rollout (Abnar & Zuidema 2020)
    gradient_x_input       df/dz at z = 1, i.e. grad_e f . (e - e')
    integrated_gradients   (z - z') . int_0^1 df/dz(a 1) da, from z' = 0 (Sundararajan et al. 2017)
    occlusion              f(1) - f(1 with z_i = 0)
    lime                   the weights of a sparse linear model fitted to f on random z (Ribeiro et al.
                           2016; Captum's Lime, cosine-similarity kernel)
    kernel_shap            Shapley values estimated by weighted regression on random z (Lundberg & Lee 2017)
    random                 a random order (the floor every method should beat)

Deletion removes the top-ranked features first, k = 0 .. N, and follows the target probability
p(z_k) = softmax(f)[target]; its AUC (the mean of the curve) is low for a faithful ranking. Insertion
adds them to the baseline in the same order; its AUC is high for a faithful ranking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.core.errors import ConfigError
from attnlab.core.extras import require
from attnlab.inspect.rollout import attention_rollout
from attnlab.nn.hooks import capture

METHODS: tuple[str, ...] = ("attention", "rollout", "gradient_x_input", "integrated_gradients", "occlusion", "lime",
                            "kernel_shap", "random")


@dataclass
class Explained:
    """One input of one model, seen through its N features.

    ``run(inputs_for_batch)``: calls the model on a batch of B copies of the input and returns logits
    (B, n_classes); ``embedding``: the module whose output (B, T, C) holds the features at
    ``positions`` (length N); ``baseline``: (N, C) embeddings that replace removed features;
    ``query``: the row of the attention that decides ("cls": row 0, "mean": the mean of the features'
    rows, "last": the last row); ``target``: the class explained; ``offset``: where the features sit in
    the attention maps relative to ``positions`` (1 for a ViT, whose [CLS] is prepended after the patch
    embedding)."""

    run: Callable[[int], Tensor]
    embedding: nn.Module
    positions: list[int]
    baseline: Tensor
    query: str
    target: int
    model: nn.Module
    offset: int = 0

    @property
    def n_features(self) -> int:
        """The number of features (tokens or patches) the attributions score."""
        return len(self.positions)

    def logits(self, z: Tensor) -> Tensor:
        """f over a batch of presence vectors z (B, N) -> logits (B, n_classes)."""
        pos = self.positions

        def mix(module, args, e: Tensor) -> Tensor:
            e = e.clone()
            w = z.to(e.dtype)[:, :, None]  # (B, N, 1)
            e[:, pos] = w * e[:, pos] + (1 - w) * self.baseline.to(e.dtype)
            return e

        handle = self.embedding.register_forward_hook(mix)
        try:
            return self.run(z.size(0))
        finally:
            handle.remove()

    def prob(self, z: Tensor, chunk: int = 64) -> Tensor:
        """The target's probability for each row of z (B, N) -> (B,)."""
        with torch.no_grad():
            return torch.cat([self.logits(z[i:i + chunk]).softmax(-1)[:, self.target]
                              for i in range(0, z.size(0), chunk)])


def _attention_rows(ex: Explained) -> tuple[Tensor, Tensor]:
    """(last layer's head-mean row, rollout row) of the deciding query, over the feature positions."""
    with torch.no_grad(), capture(ex.model, "*.hook_pattern") as seen:
        ex.logits(torch.ones(1, ex.n_features))
    names = [n for n in seen if ".cross_attn." not in n]
    if not names:
        raise ConfigError("this model has no attention patterns to explain with")
    probs = [seen[n].float() for n in names]  # per layer (1, H, T, T), first layer first
    last, roll = probs[-1].mean(1)[0], attention_rollout(probs)[0]  # (T, T)

    cols = [p + ex.offset for p in ex.positions]

    def row(m: Tensor) -> Tensor:
        if ex.query == "cls":
            r = m[0]
        elif ex.query == "mean":
            r = m[cols].mean(0)
        else:
            r = m[-1]
        return r[cols]

    return row(last), row(roll)


def attribute(ex: Explained, methods: Sequence[str] = METHODS, n_steps: int = 32, n_samples: int = 200,
              seed: int = 0) -> dict[str, Tensor]:
    """Scores (N,) per method for the target (see the module docstring); larger = more important."""
    require("captum", "the faithfulness methods (IG, SHAP, LIME)")
    from captum.attr import IntegratedGradients, KernelShap, Lime

    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ConfigError(f"unknown attribution method(s) {bad}; choose from {', '.join(METHODS)}")
    N = ex.n_features
    ones, zeros = torch.ones(1, N), torch.zeros(1, N)
    out: dict[str, Tensor] = {}
    if "attention" in methods or "rollout" in methods:
        attn, roll = _attention_rows(ex)
        out["attention"], out["rollout"] = attn, roll
    if "gradient_x_input" in methods:
        z = ones.clone().requires_grad_(True)
        ex.logits(z)[0, ex.target].backward()
        out["gradient_x_input"] = z.grad[0].detach()
    if "integrated_gradients" in methods:
        out["integrated_gradients"] = IntegratedGradients(ex.logits).attribute(
            ones, baselines=zeros, target=ex.target, n_steps=n_steps, internal_batch_size=n_steps)[0].detach()
    if "occlusion" in methods:
        with torch.no_grad():
            full = ex.logits(ones)[0, ex.target]
            dropped = 1 - torch.eye(N)  # row i: every feature but i
            out["occlusion"] = full - torch.cat([ex.logits(dropped[i:i + 64])[:, ex.target]
                                                 for i in range(0, N, 64)])
    for name, cls in (("lime", Lime), ("kernel_shap", KernelShap)):
        if name in methods:
            torch.manual_seed(seed)  # Captum draws its perturbations from torch's global generator
            with torch.no_grad():
                out[name] = cls(ex.logits).attribute(ones, baselines=zeros, target=ex.target, n_samples=n_samples,
                                                     perturbations_per_eval=min(64, n_samples))[0].detach()
    if "random" in methods:
        out["random"] = torch.rand(N, generator=torch.Generator().manual_seed(seed))
    return {k: out[k].float() for k in methods}


@dataclass
class Curves:
    """p_target after removing (deletion) or keeping (insertion) the k top-ranked features, k = 0 .. N."""

    deletion: Tensor  # (N + 1,)
    insertion: Tensor  # (N + 1,)

    @property
    def deletion_auc(self) -> float:
        """Area under the deletion curve (lower: the top-ranked features mattered more)."""
        return float(torch.trapezoid(self.deletion, dx=1.0 / (len(self.deletion) - 1)))

    @property
    def insertion_auc(self) -> float:
        """Area under the insertion curve (higher: the top-ranked features mattered more)."""
        return float(torch.trapezoid(self.insertion, dx=1.0 / (len(self.insertion) - 1)))


def _top_k(scores: Tensor) -> Tensor:
    """(N + 1, N) presence rows: row k keeps the k top-ranked features (ties broken by position, stably)."""
    N = scores.numel()
    order = torch.argsort(-scores.cpu(), stable=True)  # the presence vectors z live on the CPU
    ranks = torch.empty(N, dtype=torch.long)
    ranks[order] = torch.arange(N)  # ranks[i]: the place of feature i in the ranking
    return (torch.arange(N + 1)[:, None] > ranks[None, :]).float()  # row k: features ranked 0 .. k-1


def curves_of(ex: Explained, rankings: dict[str, Tensor]) -> dict[str, Curves]:
    """Deletion and insertion curves of several rankings, their 2 (N + 1) rows each scored in one batch."""
    tops = [_top_k(s) for s in rankings.values()]
    p = ex.prob(torch.cat([z for top in tops for z in (1 - top, top)]))  # (2 (N + 1) n_rankings,)
    rows = p.split(tops[0].size(0)) if tops else ()
    return {name: Curves(rows[2 * i], rows[2 * i + 1]) for i, name in enumerate(rankings)}


def curves(ex: Explained, scores: Tensor) -> Curves:
    """Deletion and insertion curves of one ranking (ties broken by position, stably)."""
    return curves_of(ex, {"ranking": scores})["ranking"]


def faithfulness(ex: Explained, methods: Sequence[str] = METHODS, seed: int = 0, **kwargs) -> dict[str, dict]:
    """Per method: its scores and its deletion / insertion AUCs on this input."""
    scores = attribute(ex, methods, seed=seed, **kwargs)
    return {name: {"scores": scores[name], "deletion_auc": c.deletion_auc, "insertion_auc": c.insertion_auc,
                   "deletion": c.deletion, "insertion": c.insertion}
            for name, c in curves_of(ex, scores).items()}


# --------------------------------------------------------------------------- the families


def for_vit(model: nn.Module, image: Tensor, baseline_image: Tensor | None = None,
            target: int | None = None) -> Explained:
    """A ViT on one normalised image (C, H, W); features are the patches; the baseline is the given
    image (default: all zeros, the dataset mean after normalisation)."""
    model.eval()
    base = torch.zeros_like(image) if baseline_image is None else baseline_image
    with torch.no_grad():
        baseline = model.patch_emb(base[None])[0]  # (N, C)
        logits = model(image[None]).logits[0]
    n = baseline.size(0)
    query = "cls" if model.config.pooling == "cls" else "mean"
    return Explained(lambda B: model(image[None].expand(B, -1, -1, -1)).logits, model.patch_emb, list(range(n)),
                     baseline, query, int(logits.argmax()) if target is None else target, model, offset=1)


def for_token_classifier(model: nn.Module, run: Callable[[Tensor], Tensor], ids: Tensor, embedding: nn.Module,
                         positions: Sequence[int], baseline_id: int, query: str,
                         target: int | None = None) -> Explained:
    """A classifier of token ids (1, T): ``run(ids (B, T)) -> logits (B, n_classes)``; ``positions``: the
    tokens to explain (e.g. all but [CLS]/[SEP]); removed ones take the embedding of ``baseline_id``."""
    model.eval()
    with torch.no_grad():
        baseline = embedding(torch.full((len(positions),), baseline_id, dtype=torch.long))  # (N, C)
        logits = run(ids)[0]
    return Explained(lambda B: run(ids.expand(B, -1)), embedding, list(positions), baseline, query,
                     int(logits.argmax()) if target is None else target, model)


# --------------------------------------------------------------------------- one input of a run


def _table(result: dict[str, dict], labels: Sequence[str], k: int = 3) -> list[dict]:
    rows = []
    for name, r in sorted(result.items(), key=lambda kv: kv[1]["deletion_auc"]):
        top = torch.argsort(-r["scores"], stable=True)[:k].tolist()
        rows.append({"method": name, "deletion_auc": r["deletion_auc"], "insertion_auc": r["insertion_auc"],
                     "top": [labels[i] for i in top], "scores": [round(float(v), 6) for v in r["scores"]],
                     "deletion": [round(float(v), 6) for v in r["deletion"]]})
    return rows


def run_report(run_dir, text: str | None = None, image: str | None = None, resize: bool = False,
               n_samples: int = 200, seed: int = 0) -> dict:
    """Every method on one input of a run, ranked by deletion AUC: a GPT's next token after ``text``
    (features: its tokens, removed = a space, else id 0), a BERT classifier's class of ``text``
    (features: the tokens between [CLS] and [SEP], removed = [MASK]), or a ViT's class of ``image``
    (features: the patches, removed = the mean image)."""
    from attnlab.tokenizers.specials import encode_for
    from attnlab.training.runs import load_model_and_tokenizer

    if image is not None:
        from attnlab.data.images import normalize, read_image
        from attnlab.models.registry import from_pretrained
        from attnlab.training.tasks.images import load_labels

        model = from_pretrained(run_dir).eval()
        if model.config.family != "vit":
            raise ConfigError(f"--image explains a vit run; {run_dir} holds a {model.config.family} model")
        labels = load_labels(run_dir)
        c = model.config
        pixels = read_image(image, c.in_channels, c.image_size, resize=resize)
        ex = for_vit(model, normalize(pixels[None], labels["mean"], labels["std"])[0])
        g = c.image_size // c.patch_size
        names = [f"patch ({i // g}, {i % g})" for i in range(g * g)]
        what = labels["classes"][ex.target]
    else:
        model, tok = load_model_and_tokenizer(run_dir)
        model.eval()
        family = model.config.family
        ids = tok.encode(text or "")
        if family == "gpt":
            if not 1 <= len(ids) <= model.config.block_size:
                raise ConfigError(f"--text must be 1..{model.config.block_size} tokens, got {len(ids)}")
            space = tok.encode(" ")
            idx = torch.tensor([ids])
            ex = for_token_classifier(model, lambda x: model(x).logits[:, -1], idx, model.tok_emb,
                                      range(len(ids)), space[0] if len(space) == 1 else 0, "last")
            names, what = [tok.decode([i]) for i in ids], f"next token {tok.decode([ex.target])!r}"
        elif family == "bert" and getattr(model, "classifier", None) is not None:
            if not 1 <= len(ids) <= model.config.block_size - 2:
                raise ConfigError(f"--text must be 1..{model.config.block_size - 2} tokens, got {len(ids)}")
            idx = torch.tensor([encode_for(model, tok, text or "")])  # [CLS] ids [SEP]: tokenizers.specials
            ex = for_token_classifier(model, lambda x: model(x).logits, idx, model.embeddings.tok_emb,
                                      range(1, len(ids) + 1), tok.mask_id,
                                      "cls" if model.config.pooling == "cls" else "mean")
            names, what = [tok.decode([i]) for i in ids], f"class {ex.target}"
        else:
            raise ConfigError(f"--faithfulness explains a gpt's next token, a bert classifier's class (--text) or a "
                              f"vit's class (--image); {run_dir} holds a {family} model"
                              + (" without a classification head" if family == "bert" else ""))
    result = faithfulness(ex, seed=seed, n_samples=n_samples)
    return {"explained": what, "probability": float(ex.prob(torch.ones(1, ex.n_features))[0]),
            "features": names, "methods": _table(result, names)}
