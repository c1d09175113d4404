"""BERT: an encoder-only transformer with masked-LM, next-sentence and classification heads.

    h_0 = Dropout(LayerNorm(E[x] + P[pos] + S[seg]))       token + position + segment embeddings
    h_l = Block_l(h_{l-1}, padding mask),  l = 1..L       bidirectional self-attention + FFN
    masked LM:     p(x_t | x_masked) = softmax(LayerNorm(gelu(h_L W_t + b_t)) E^T + b)   (tied to E)
    pooled (cls):  u = tanh(h_L[:, 0] W_p + b_p)          the [CLS] summary (BERT's pooler)
    pooled (mean): u = sum_t m_t h_L[:, t] / sum_t m_t    mean over real tokens (sentence-transformers)
    next sentence: softmax(u_cls W_nsp + b_nsp)            is segment B the real continuation of A?
    classify:      softmax(Dropout(u) W_c + b_c);  per token: softmax(Dropout(h_L) W_tc + b_tc)
    answer span:   [s_t, e_t] = Dropout(h_L[:, t]) W_s + b_s     start and end logits of each token (head_type="span")

Blocks are post-norm by default as in the original BERT (``norm_position="post"`` in the presets;
pre-norm adds a final norm). Padding is a key mask: real tokens never attend to [PAD].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.models.base import PretrainedModel
from attnlab.models.bert.config import BertConfig
from attnlab.models.layers import transformer_blocks
from attnlab.nn.activations import activate
from attnlab.nn.attention import padding_mask
from attnlab.nn.mixing import BlockContext
from attnlab.nn.norms import build_norm
from attnlab.nn.positions import build_positions

IGNORE_INDEX = -100  # label of positions that carry no loss (unselected tokens, padding)


@dataclass
class BertOutput:
    """What ``Bert.forward`` returns.

    hidden_states (B, T, C): the last layer; pooled (B, C): the [CLS] pooler output or the masked
    mean, per ``config.pooling``. mlm_logits: (B, T, V) with ``with_mlm``, or (N, V) at the N
    positions whose ``mlm_labels`` are not -100 (row-major order) when labels are given.
    nsp_logits (B, 2) (from the [CLS] pooler, whatever the pooling); logits (B, n_classes) and
    token_logits (B, T, n_classes) when the model has ``n_classes``; predictions (B, n_targets), the
    regression head's pool(h) W_r + b_r, when it has ``n_targets``. ``head_type="token"`` keeps only the
    token classifier; ``head_type="span"`` gives start_logits and end_logits (B, T) instead. ``loss`` is the
    sum of the losses of the labels given (mlm_loss, nsp_loss, cls_loss, reg_loss = mean (prediction -
    target)^2, span_loss = (CE(start) + CE(end)) / 2 over the positions).
    """

    hidden_states: Tensor
    pooled: Tensor
    mlm_logits: Tensor | None = None
    nsp_logits: Tensor | None = None
    logits: Tensor | None = None
    token_logits: Tensor | None = None
    loss: Tensor | None = None
    mlm_loss: Tensor | None = None
    nsp_loss: Tensor | None = None
    cls_loss: Tensor | None = None
    predictions: Tensor | None = None
    reg_loss: Tensor | None = None
    start_logits: Tensor | None = None
    end_logits: Tensor | None = None
    span_loss: Tensor | None = None


def mean_pool(hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
    """sum_t m_t h_t / max(sum_t m_t, 1e-9): hidden (B, T, C), mask (B, T) of 1/0 -> (B, C)."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    m = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


class BertEmbeddings(nn.Module):
    """h_0 = Dropout(LayerNorm(E[x] + P[pos] + S[seg])): (B, T) ids -> (B, T, C)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        c = config
        assert c.vocab_size is not None
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.positions = build_positions(c.positions, c.d_model, c.n_head, c.block_size, c.rope_theta)
        self.seg_emb = nn.Embedding(c.n_segments, c.d_model) if c.n_segments > 0 else None
        self.norm = build_norm(c.norm, c.d_model, c.norm_eps, c.bias)
        self.dropout = c.dropout

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        T = input_ids.size(1)
        x = self.tok_emb(input_ids)  # (B, T, C)
        pe = self.positions.embed(torch.arange(T, device=input_ids.device))
        if pe is not None:
            x = x + pe  # (T, C) broadcasts over the batch
        if self.seg_emb is not None:
            x = x + self.seg_emb(token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids))
        x = self.norm(x)
        return F.dropout(x, self.dropout, self.training) if self.dropout > 0 else x


class Bert(PretrainedModel):
    """Encoder-only transformer (BERT layout) with MLM, NSP, sequence, token classification and span heads."""

    config_class = BertConfig

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        if config.vocab_size is None:
            raise ValueError("BertConfig.vocab_size must be set before building a BERT")
        c = config
        self.embeddings = BertEmbeddings(c)
        self.blocks = transformer_blocks(c)
        # post-norm blocks end in a norm already; pre-norm leaves the residual stream un-normalised
        self.norm_f = build_norm(c.norm, c.d_model, c.norm_eps, c.bias) if c.norm_position == "pre" else nn.Identity()
        # masked-LM head: transform (dense + act + LayerNorm), then the decoder tied to E, with its own bias
        self.mlm_transform = nn.Linear(c.d_model, c.d_model)
        self.mlm_norm = build_norm(c.norm, c.d_model, c.norm_eps, c.bias)
        self.mlm_decoder = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.mlm_bias = nn.Parameter(torch.zeros(c.vocab_size))
        self.pooler = nn.Linear(c.d_model, c.d_model)  # tanh([CLS] W_p + b_p)
        self.nsp_head = nn.Linear(c.d_model, 2)
        self.classifier: nn.Linear | None = None
        self.token_classifier: nn.Linear | None = None
        if c.n_classes is not None:
            self.classifier = nn.Linear(c.d_model, c.n_classes) if c.head_type == "sequence" else None
            self.token_classifier = nn.Linear(c.d_model, c.n_classes)
        self.span_classifier = nn.Linear(c.d_model, 2) if c.head_type == "span" else None  # (start, end) per token
        self.regressor = nn.Linear(c.d_model, c.n_targets) if c.n_targets is not None else None
        self.apply(self._init_weights)
        if self.regressor is not None:
            nn.init.zeros_(self.regressor.weight)  # start at the mean of the (standardised) targets

    # -- the encoder ---------------------------------------------------------------------------

    def encode(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """input_ids (B, T), attention_mask (B, T) 1 = token, 0 = padding -> h_L (B, T, C)."""
        T = input_ids.size(1)
        if self.config.positions == "learned" and input_ids.size(1) > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens exceeds the context of {self.config.block_size}")
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, C)
        mask = padding_mask(attention_mask.bool()) if attention_mask is not None else None  # (B, 1, 1, T)
        pos = torch.arange(T, device=input_ids.device)
        rotary = self.embeddings.positions.rotary(pos)
        bias = self.embeddings.positions.contiguous_bias(T, T, input_ids.device)
        for block in self.blocks:
            x = block(x, BlockContext(mask=mask, bias=bias, rotary=rotary))  # (B, T, C)
        return self.norm_f(x)  # (B, T, C)

    def mlm_head(self, h: Tensor) -> Tensor:
        """(..., C) -> (..., V): LayerNorm(act(h W_t + b_t)) E^T + b."""
        h = self.mlm_norm(activate(self.mlm_transform(h), self.config.activation))
        weight = self.embeddings.tok_emb.weight if self.mlm_decoder is None else self.mlm_decoder.weight
        return F.linear(h, weight, self.mlm_bias)

    def pool(self, hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
        """(B, T, C) -> (B, C): the [CLS] pooler (tanh) or the masked mean, per config.pooling."""
        if self.config.pooling == "mean":
            return mean_pool(hidden, attention_mask)
        return torch.tanh(self.pooler(hidden[:, 0]))

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        mlm_labels: Tensor | None = None,
        next_sentence_label: Tensor | None = None,
        labels: Tensor | None = None,
        token_labels: Tensor | None = None,
        targets: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        with_mlm: bool = False,
    ) -> BertOutput:
        """Encode, then the heads the labels ask for.

        mlm_labels (B, T): original ids at the selected positions, -100 elsewhere; next_sentence_label
        (B,): 0 = B follows A, 1 = B is random (BERT's convention); labels (B,): sequence classes;
        token_labels (B, T): per-token classes, -100 to skip; targets (B, n_targets): regression values;
        start_positions, end_positions (B,): the answer's first and last token (head_type="span").
        ``with_mlm``: full (B, T, V) MLM logits.
        """
        hidden = self.encode(input_ids, attention_mask, token_type_ids)
        pooled = self.pool(hidden, attention_mask)
        cls_pooled = pooled if self.config.pooling == "cls" else torch.tanh(self.pooler(hidden[:, 0]))
        out = BertOutput(hidden_states=hidden, pooled=pooled, nsp_logits=self.nsp_head(cls_pooled))
        losses: list[Tensor] = []
        if mlm_labels is not None:
            selected = mlm_labels != IGNORE_INDEX  # (B, T)
            out.mlm_logits = self.mlm_head(hidden[selected])  # (N, V): only where there is a loss
            out.mlm_loss = F.cross_entropy(out.mlm_logits, mlm_labels[selected]) if selected.any() else \
                out.mlm_logits.sum() * 0.0
            losses.append(out.mlm_loss)
        elif with_mlm:
            out.mlm_logits = self.mlm_head(hidden)  # (B, T, V)
        if next_sentence_label is not None:
            out.nsp_loss = F.cross_entropy(out.nsp_logits, next_sentence_label)
            losses.append(out.nsp_loss)
        drop = self.config.dropout if self.training else 0.0
        if self.classifier is not None:
            out.logits = self.classifier(F.dropout(pooled, drop))  # (B, n_classes)
            if labels is not None:
                out.cls_loss = F.cross_entropy(out.logits, labels)
                losses.append(out.cls_loss)
        elif labels is not None:
            raise ValueError("this BERT has no sequence classification head: set model.n_classes and "
                             "model.head_type=sequence")
        if self.token_classifier is not None:
            out.token_logits = self.token_classifier(F.dropout(hidden, drop))  # (B, T, n_classes)
            if token_labels is not None:
                token_loss = F.cross_entropy(out.token_logits.flatten(0, 1), token_labels.flatten(),
                                             ignore_index=IGNORE_INDEX)
                out.cls_loss = token_loss if out.cls_loss is None else out.cls_loss + token_loss
                losses.append(token_loss)
        elif token_labels is not None:
            raise ValueError("this BERT has no classification head: set model.n_classes")
        if self.span_classifier is not None:
            span = self.span_classifier(F.dropout(hidden, drop))  # (B, T, 2)
            out.start_logits, out.end_logits = span[..., 0], span[..., 1]  # (B, T) each
            if start_positions is not None and end_positions is not None:
                out.span_loss = (F.cross_entropy(out.start_logits, start_positions)
                                 + F.cross_entropy(out.end_logits, end_positions)) / 2
                losses.append(out.span_loss)
        elif start_positions is not None or end_positions is not None:
            raise ValueError("this BERT has no span head: set model.head_type=span")
        if self.regressor is not None:
            out.predictions = self.regressor(F.dropout(pooled, self.config.dropout if self.training else 0.0))
            if targets is not None:
                out.reg_loss = F.mse_loss(out.predictions.float(), targets.float())  # (B, n_targets) each
                losses.append(out.reg_loss)
        elif targets is not None:
            raise ValueError("this BERT has no regression head: set model.n_targets")
        if losses:
            out.loss = torch.stack(losses).sum()
        return out

    @torch.no_grad()
    def embed(self, input_ids: Tensor, attention_mask: Tensor | None = None, normalize: bool = True) -> Tensor:
        """Sentence embeddings (B, C): mean of h_L over real tokens, L2-normalised (sentence-transformers)."""
        hidden = self.encode(input_ids, attention_mask)
        e = mean_pool(hidden, attention_mask)
        return F.normalize(e, dim=-1) if normalize else e
