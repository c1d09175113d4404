"""A planted induction circuit, shared by the tests of tests/inspect: a 2-layer GPT whose weights are set
by hand so that head 0 of layer 0 is a previous-token head and head 0 of layer 1 an induction head
(Olsson et al. 2022); every other head and both MLPs are zero.

The residual stream (d = V + T + 2V) holds four one-hot subspaces, and RMSNorm only rescales it:

    A  [0, V)           the current token            (token embedding)
    P  [V, V+T)         the current position         (learned position table)
    C  [V+T, 2V+T)      the previous token           (written by L0H0: attends to position i-1, copies A)
    D  [2V+T, 3V+T)     the predicted next token     (written by L1H0: attends to the key whose C equals
                                                      the query's A, i.e. the token after an earlier copy)

and the untied LM head reads D.
"""

from __future__ import annotations

import torch

from attnlab.inspect.heads import repeated_random_tokens
from attnlab.models import GPTConfig, build_model

V, T, H = 10, 16, 2
A, P, C, D = 0, V, V + T, 2 * V + T
D_MODEL = 3 * V + T  # 46: two heads of 23 dims


def planted_gpt(beta: float = 6.0, gamma: float = 6.0, out: float = 8.0):
    cfg = GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=H, d_model=D_MODEL, norm="rmsnorm", bias=False,
                    tie_embeddings=False, positions="learned", attn_backend="eager")
    model = build_model(cfg).eval()
    hd = D_MODEL // H
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for n in model.modules():  # norms keep their unit gains
            if hasattr(n, "weight") and type(n).__name__ == "RMSNorm":
                n.weight.fill_(1.0)
        model.tok_emb.weight[:, A:A + V] = torch.eye(V)
        model.positions.weight[:, P:P + T] = torch.eye(T)
        q0, k0, v0 = (model.blocks[0].mixer.qkv_proj.weight[i * D_MODEL: i * D_MODEL + hd] for i in range(3))
        for i in range(1, T):  # L0H0: query at position i looks for the key at position i - 1
            q0[i - 1, P + i] = beta
        k0[:T, P:P + T] = torch.eye(T)
        v0[:V, A:A + V] = torch.eye(V)  # ... and copies its token
        model.blocks[0].mixer.out_proj.weight[C:C + V, :V] = torch.eye(V)  # into C
        q1, k1, v1 = (model.blocks[1].mixer.qkv_proj.weight[i * D_MODEL: i * D_MODEL + hd] for i in range(3))
        q1[:V, A:A + V] = gamma * torch.eye(V)  # L1H0: query = current token
        k1[:V, C:C + V] = torch.eye(V)  # key = that position's previous token
        v1[:V, A:A + V] = torch.eye(V)  # value = that position's own token: what came after the copy
        model.blocks[1].mixer.out_proj.weight[D:D + V, :V] = out * torch.eye(V)  # into D
        model.lm_head.weight[:, D:D + V] = torch.eye(V)
    return model


HALF = (T - 1) // 2  # 7: sequences [0, r, r] of 15 tokens, r drawn from 1..V-1 without repeats
FIRST_COPY = 1 + HALF  # position 8 holds the first token of the second copy


def probe(n: int, seed: int) -> torch.Tensor:
    """(n, 15) rows [0, r, r]: position 0 holds a token that r never uses (the planted previous-token head
    copies position 0's own token into C, so a token there must not be one the queries look for)."""
    return torch.cat([torch.zeros(n, 1, dtype=torch.long), repeated_random_tokens(n, HALF, V, seed=seed, low=1)], 1)
