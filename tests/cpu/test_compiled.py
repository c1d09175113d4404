"""The CPU kernels inside inductor's graphs, built as ``compile=true`` builds them (``training.compiling``: inductor
with its C++ wrapper): a GPT with kernels=attention,gelu,linear, compiled, trains as the stock eager GPT does, and
its compiled forward and backward call every kernel's ops from the generated code (none of the blocks' products,
GELUs or attention is left to aten; the unembedding stays torch's).

Each kernel's own file traces the same kind of model through torch.compile's ``aot_eager`` backend (dynamo and
AOTAutograd: the graphs, fake tensors and autograd that inductor starts from, without generating C++), so that
inductor's C++ build, several seconds per graph, is paid here once for all the kernels."""

import torch
from torch.profiler import ProfilerActivity, profile

from attnlab.cpu import accelerate
from attnlab.cpu import attention as attention_cpu
from attnlab.cpu import linear as linear_cpu
from attnlab.models import GPTConfig, build_model
from attnlab.training.compiling import compile_forward
from tests.helpers import assert_trains_the_same

D = 32  # the head size tests/cpu/test_attention.py builds: one attention-kernel build for both files


def test_every_kernel_is_called_from_inductors_graphs_and_trains_as_eager():
    cfg = GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=2, d_model=2 * D, dropout=0.0, bias=False)
    torch.manual_seed(0)
    stock, fused = build_model(cfg), build_model(cfg)
    fused.load_state_dict(stock.state_dict())
    assert accelerate(fused, ("attention", "gelu", "linear")) == {"attention": 2, "gelu": 2, "linear": 8}
    forward = compile_forward(fused, "cpu")
    x, y = torch.randint(0, 50, (3, 32)), torch.randint(0, 50, (3, 32))
    assert_trains_the_same([(stock, stock), (forward, fused)], x, y, loss_tol=1e-5, grad_tol=1e-5)

    with profile(activities=[ProfilerActivity.CPU]) as prof:  # compiled above, outside the profile
        forward(idx=x, targets=y).loss.backward()
    names = [e.name for e in prof.events()]
    linear, attention = linear_cpu.load(), attention_cpu.load(D)
    assert not [n for n in names if "scaled_dot_product" in n]
    assert {op: names.count(f"{linear}::{op}") for op in ("linear", "linear_gelu", "linear_grad_input",
                                                          "linear_grad_weight")} \
        == {"linear": 6, "linear_gelu": 2, "linear_grad_input": 8, "linear_grad_weight": 8}  # x W_1 and GELU fused
    assert {op: names.count(f"{attention}::{op}") for op in ("attn", "attn_backward")} == {"attn": 2,
                                                                                          "attn_backward": 2}
