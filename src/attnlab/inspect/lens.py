"""The logit lens (nostalgebraist 2020): read the residual stream of every layer as if it were the last.

    r_0 = the embeddings (the stream entering block 0),  r_l = the stream leaving block l-1
    logits_l = Unembed(FinalNorm(r_l))        (B, T, V),  l = 0 .. L;  logits_L are the model's own

For each layer: the next-token loss against the targets (how much of the prediction is already
there) and the top tokens at each position. Read from the hook points ``blocks.{i}.hook_resid_pre``
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


@torch.no_grad()
def logit_lens(model: nn.Module, idx: Tensor, targets: Tensor | None = None, k: int = 5) -> LensResult:
    """The logit lens of a GPT on token ids idx (B, T) (see the module docstring)."""
    config = model.config
    if config.family != "gpt" or getattr(model, "residual", None) is not None:
        raise ConfigError("the logit lens reads one residual stream: a gpt with residual=standard")
    L = config.n_layer
    with capture(model, "blocks.*.hook_resid_pre", f"blocks.{L - 1}.hook_resid_post") as seen:
        model(idx)
    streams = [seen[f"blocks.{i}.hook_resid_pre"] for i in range(L)] + [seen[f"blocks.{L - 1}.hook_resid_post"]]
    logits = torch.stack([model.lm_head(model.norm_f(r)) for r in streams])  # (L+1, B, T, V)
    loss = None
    if targets is not None:
        loss = [F.cross_entropy(lg.reshape(-1, lg.size(-1)), targets.reshape(-1), ignore_index=-100).item()
                for lg in logits]
    return LensResult(["embed", *[f"block {i}" for i in range(L)]], logits, logits.topk(k, dim=-1).indices, loss)
