"""Weight processing for reading a GPT (TransformerLens's ``fold_ln``, ``center_writing_weights``,
``center_unembed``, ``fold_value_biases``): the same function, written with weights that are easier to read.

Each step changes the weights and leaves the model's predictions unchanged (the logits exactly, up to float
rounding; ``center_unembed`` shifts every logit of a position by one constant, so the probabilities and every
logit difference stay). Write n(x) = (x - mean(x)) / s, s = sqrt(var(x) + eps), for LayerNorm's normalised
input (RMSNorm: n(x) = x / s, s = sqrt(mean(x^2) + eps)) and W (out, C), b for the linear map that reads it:

    fold_ln                 W (n(x) * gamma + beta) + b = (W diag(gamma)) n(x) + (W beta + b)
                            so W <- W diag(gamma), b <- b + W beta, gamma <- 1, beta <- 0, in every block (into
                            W_QKV and W_1) and at the end (into the unembedding W_U, which gains the bias
                            W_U beta_f: the LM head is untied from the embedding and given a bias). LayerNorm
                            only: each row of W is also centred, W <- W - mean_C(W), since n(x) has mean 0
                            and the mean of a row reads nothing.
    center_writing_weights  every vector written into the residual stream loses its mean over C: W_E, W_pos,
                            W_O and W_2 (columns over C) and their biases, w <- w - mean_C(w). The stream then
                            has mean 0 at every position; each LayerNorm removes the mean anyway, so nothing
                            downstream changes (LayerNorm models only: an RMSNorm reads the mean).
    center_unembed          W_U <- W_U - mean_V(W_U), b_U <- b_U - mean(b_U): every logit of a position moves
                            by the same amount, so softmax and logit differences are unchanged.
    fold_value_biases       the value bias b_V reaches the output as sum_s p_s b_V = b_V (each row of
                            probabilities sums to 1), so b_O <- b_O + W_O b_V and b_V <- 0.

``process_weights(model, ...)`` applies the chosen steps in that order (TransformerLens's), to a pre-norm GPT
of attention and dense FFN blocks with residual=standard; it refuses anything else with one line. A processed
model is for looking at (``attnlab.load(..., fold_ln=True)``): its hook points then read like
TransformerLens's processed ones (``docs/lens.md``); keep the original for training and saving.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.core.errors import ConfigError
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.ffn import FeedForward
from attnlab.nn.norms import LayerNorm, RMSNorm
from attnlab.nn.positions import LearnedPositions


def check_processable(model: nn.Module, centring: bool) -> None:
    """One line unless ``model`` is a pre-norm GPT of attention + dense FFN blocks with residual=standard
    (and, for centring, LayerNorm)."""
    c = getattr(model, "config", None)
    if c is None or c.family != "gpt" or c.norm_position != "pre" or getattr(model, "residual", None) is not None:
        raise ConfigError("weight processing (fold_ln, centring) reads a pre-norm gpt with residual=standard")
    for i, block in enumerate(model.blocks):
        if type(block.mixer) is not MultiHeadAttention or type(block.ffn) is not FeedForward:
            raise ConfigError(f"weight processing reads attention + dense FFN blocks; block {i} has "
                              f"{type(block.mixer).__name__} and {type(block.ffn).__name__}")
        if block.mixer.q_norm is not None:
            raise ConfigError("weight processing: qk_norm normalises q and k again after W_QKV; fold_ln cannot see it")
    if centring and not isinstance(model.norm_f, LayerNorm):
        raise ConfigError("centring the writing weights needs LayerNorm (an RMSNorm reads the stream's mean)")


def _untie_head(model: nn.Module) -> nn.Linear:
    """The LM head as its own layer with a bias (zero at first): its weights are about to change apart from
    the embedding's."""
    old = model.lm_head
    head = nn.Linear(old.in_features, old.out_features, bias=True).to(old.weight)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.copy_(old.bias if old.bias is not None else torch.zeros_like(head.bias))
    model.lm_head = head
    return head


@torch.no_grad()
def _fold(norm: nn.Module, linear: nn.Linear) -> None:
    """W <- W diag(gamma), b <- b + W beta (LayerNorm: rows centred), gamma <- 1, beta <- 0."""
    W = linear.weight  # (out, C)
    beta = getattr(norm, "bias", None)
    bias = W @ beta if beta is not None else torch.zeros(W.size(0), dtype=W.dtype, device=W.device)
    W.mul_(norm.weight)
    if isinstance(norm, LayerNorm):
        W.sub_(W.mean(dim=1, keepdim=True))
    if linear.bias is None:
        if bias.abs().max() > 0:
            raise ConfigError("fold_ln: the norm has a bias and the layer that reads it has none to take it")
    else:
        linear.bias.add_(bias)
    norm.weight.fill_(1.0)
    if beta is not None:
        beta.zero_()


def fold_layer_norm(model: nn.Module) -> None:
    """fold_ln (module docstring), in place: every norm's gain and bias into the layer that reads it."""
    check_processable(model, centring=False)
    for block in model.blocks:
        _fold(block.norm_mixer, block.mixer.qkv_proj)
        _fold(block.norm_ffn, block.ffn.fc_in)
    if isinstance(model.norm_f, LayerNorm | RMSNorm):
        _fold(model.norm_f, _untie_head(model))


@torch.no_grad()
def _centre_columns(linear: nn.Linear) -> None:
    """A layer that writes into the stream, y = W x + b with W (C, in): W <- W - mean_C(W), b <- b - mean(b)."""
    linear.weight.sub_(linear.weight.mean(dim=0, keepdim=True))
    if linear.bias is not None:
        linear.bias.sub_(linear.bias.mean())


@torch.no_grad()
def center_writing_weights(model: nn.Module) -> None:
    """center_writing_weights (module docstring), in place: W_E, W_pos, W_O, W_2 and their biases."""
    check_processable(model, centring=True)
    if model.lm_head.weight is model.tok_emb.weight:
        _untie_head(model)  # the unembedding keeps the embedding's values
    model.tok_emb.weight.sub_(model.tok_emb.weight.mean(dim=1, keepdim=True))  # (V, C) rows
    if isinstance(model.positions, LearnedPositions):
        model.positions.weight.sub_(model.positions.weight.mean(dim=1, keepdim=True))  # (block_size, C)
    for block in model.blocks:
        _centre_columns(block.mixer.out_proj)
        _centre_columns(block.ffn.fc_out)


@torch.no_grad()
def center_unembed(model: nn.Module) -> None:
    """center_unembed (module docstring), in place: W_U and b_U lose their mean over the vocabulary."""
    check_processable(model, centring=False)
    if getattr(model.config, "logit_softcap", None) is not None:
        raise ConfigError("center_unembed shifts the logits, and a soft cap (cap * tanh(z / cap)) bends them: "
                          "leave it off for a soft-capped model")
    head = _untie_head(model) if model.lm_head.weight is model.tok_emb.weight else model.lm_head
    head.weight.sub_(head.weight.mean(dim=0, keepdim=True))  # (V, C): mean over the vocabulary
    if head.bias is not None:
        head.bias.sub_(head.bias.mean())


@torch.no_grad()
def fold_value_biases(model: nn.Module) -> None:
    """fold_value_biases (module docstring), in place: b_O <- b_O + W_O b_V, b_V <- 0 in every block."""
    check_processable(model, centring=False)
    for block in model.blocks:
        attn = block.mixer
        b = attn.qkv_proj.bias
        if b is None:
            continue
        H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
        b_v = b[(H + Hkv) * D:].view(Hkv, D).repeat_interleave(H // Hkv, dim=0).reshape(H * D)  # each query head's
        if attn.out_proj.bias is None:
            raise ConfigError("fold_value_biases: the output projection has no bias to take the value bias")
        attn.out_proj.bias.add_(attn.out_proj.weight @ b_v)
        b[(H + Hkv) * D:] = 0.0


def process_weights(model: nn.Module, fold_ln: bool = False, center_writing: bool = False,
                    center_unembedding: bool = False, fold_values: bool = False) -> nn.Module:
    """The chosen steps of the module docstring, in place and in TransformerLens's order; returns ``model``."""
    if fold_ln or center_writing or center_unembedding or fold_values:
        check_processable(model, centring=center_writing)
    if fold_ln:
        fold_layer_norm(model)
    if center_writing:
        center_writing_weights(model)
    if center_unembedding:
        center_unembed(model)
    if fold_values:
        fold_value_biases(model)
    return model
