"""Small models for the inspect tests: GPTs, and hand-assembled encoder / encoder-decoder stacks
of attention blocks standing in for the BERT and seq2seq families."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.models import GPTConfig
from attnlab.models.gpt import GPT
from attnlab.nn.attention import padding_mask
from attnlab.nn.blocks import attention_block
from attnlab.nn.mixing import BlockContext


def tiny_gpt(backend: str = "eager", positions: str = "learned", n_kv_head: int | None = None, seed: int = 0,
             n_layer: int = 2, n_head: int = 4, d_model: int = 32, vocab_size: int = 17) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=vocab_size, block_size=32, n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head,
                      d_model=d_model, positions=positions, attn_backend=backend, init_std=0.2)
    return GPT(cfg).eval()


class Encoder(nn.Module):
    """Embedding + bidirectional post-norm blocks with a key-padding mask (a BERT stand-in)."""

    def __init__(self, backend: str = "eager", vocab: int = 13, d: int = 32, n_head: int = 4, n_layer: int = 2,
                 n_kv_head: int | None = None) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(32, d) * 0.5)
        self.blocks = nn.ModuleList(attention_block(d, n_head, n_kv_heads=n_kv_head, norm_position="post",
                                                    backend=backend) for _ in range(n_layer))

    def forward(self, idx: Tensor, lengths: Tensor) -> Tensor:
        x = self.emb(idx) + self.pos[: idx.size(1)]  # (B, T, C)
        mask = padding_mask(lengths, idx.size(1))  # (B, 1, 1, T)
        for block in self.blocks:
            x = block(x, BlockContext(mask=mask))
        return x


class EncoderDecoder(nn.Module):
    """An encoder plus a causal decoder with cross-attention to it (a seq2seq stand-in)."""

    def __init__(self, backend: str = "eager", vocab: int = 13, d: int = 32, n_head: int = 4, n_layer: int = 2,
                 n_kv_head: int | None = None) -> None:
        super().__init__()
        self.encoder = Encoder(backend, vocab, d, n_head, n_layer, n_kv_head)
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(32, d) * 0.5)
        self.blocks = nn.ModuleList(attention_block(d, n_head, n_kv_heads=n_kv_head, cross_attention=True,
                                                    backend=backend) for _ in range(n_layer))
        self.head = nn.Linear(d, vocab)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt: Tensor) -> Tensor:
        memory = self.encoder(src, src_lengths)  # (B, S, C)
        x = self.emb(tgt) + self.pos[: tgt.size(1)]  # (B, T, C)
        memory_mask = padding_mask(src_lengths, src.size(1))  # (B, 1, 1, S)
        for block in self.blocks:
            x = block(x, BlockContext(is_causal=True, memory=memory, memory_mask=memory_mask))
        return self.head(x)


def with_backend(model: nn.Module, backend: str) -> nn.Module:
    """The same weights, every attention module switched to ``backend``."""
    import copy

    other = copy.deepcopy(model)
    for m in other.modules():
        if hasattr(m, "backend") and hasattr(m, "register_scores_hook"):
            m.backend = backend
    return other
