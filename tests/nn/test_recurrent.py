"""nn/recurrent.py: the RNN matches its equation step by step; both cells are causal; bad cells are refused."""

from __future__ import annotations

import pytest
import torch

from attnlab.nn.recurrent import RecurrentModel


def test_rnn_matches_the_recurrence_by_hand():
    torch.manual_seed(0)
    model = RecurrentModel(vocab_size=7, n_out=3, d_model=8, cell="rnn")
    idx = torch.randint(7, (2, 5))
    x = model.tok_emb(idx)  # (B, T, C)
    r = model.rnn
    h = torch.zeros(2, 8)
    states = []
    for t in range(5):  # h_t = tanh(W_x x_t + b_x + W_h h_{t-1} + b_h)
        h = torch.tanh(x[:, t] @ r.weight_ih_l0.T + r.bias_ih_l0 + h @ r.weight_hh_l0.T + r.bias_hh_l0)
        states.append(h)
    expected = model.head(torch.stack(states, dim=1))  # (B, T, n_out)
    torch.testing.assert_close(model(idx), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell", ["rnn", "lstm"])
def test_outputs_depend_only_on_the_past(cell):
    torch.manual_seed(0)
    model = RecurrentModel(vocab_size=7, n_out=3, d_model=8, cell=cell)
    a = torch.randint(7, (1, 6))
    b = a.clone()
    b[0, 4:] = (a[0, 4:] + 1) % 7  # change the future only
    torch.testing.assert_close(model(a)[:, :4], model(b)[:, :4])
    assert not torch.allclose(model(a)[:, 4:], model(b)[:, 4:])


def test_unknown_cell():
    with pytest.raises(ValueError, match="unknown recurrent cell 'gru'"):
        RecurrentModel(7, 3, cell="gru")
