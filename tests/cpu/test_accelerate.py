"""attnlab/cpu/accelerate.py: ``accelerate(model, kernels)`` swaps attnlab's C++ kernels into a built model in place
(the layers each kernel takes, counted), keeping its parameters, buffers, state-dict keys, config and function;
``parse_kernels`` reads a run's ``kernels`` setting; ``check_device`` refuses, before anything is built, a kernel
that never runs on the run's device and dtype."""

import copy
import shutil

import pytest
import torch
from torch import nn

from attnlab.core.errors import ConfigError
from attnlab.cpu import KERNELS, accelerate, check_device, describe, parse_kernels
from attnlab.cpu.gelu import CPUGELU
from attnlab.cpu.linear import CPUFeedForward, CPULinear
from attnlab.cpu.scan import CPUSelectiveSSM
from attnlab.models import GPTConfig, build_model
from attnlab.nn.attention import MultiHeadAttention

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the kernels are built with g++")


def _hybrid() -> GPTConfig:
    """Four blocks: SSM, attention, SSM, attention, each with a dense GELU FFN; heads of 32 (the head size
    tests/cpu/test_attention.py builds the attention kernel for: each size is a build of its own)."""
    return GPTConfig(vocab_size=50, block_size=32, n_layer=4, n_head=2, d_model=64, dropout=0.0, bias=False,
                     mixer="hybrid")


def _count(model: nn.Module, kind: type) -> int:
    return sum(isinstance(m, kind) for m in model.modules())


@needs_gxx
def test_accelerate_swaps_the_layers_and_keeps_the_model():
    cfg = _hybrid()
    torch.manual_seed(0)
    plain = build_model(cfg)
    model = copy.deepcopy(plain)
    before = copy.deepcopy(model.config)
    took = accelerate(model, KERNELS, device_type="cpu", dtype="float32")
    # 2 attention layers; 4 FFNs' GELUs; qkv_proj and out_proj of 2 attention layers and fc_in and fc_out of 4 FFNs
    assert took == {"attention": 2, "gelu": 4, "linear": 12, "scan": 2}
    assert describe(took) == "kernels: attention (2 layers), gelu (4 layers), linear (12 layers), scan (2 layers)"
    assert [m.backend for m in model.modules() if type(m) is MultiHeadAttention] == ["cpu-fused"] * 2
    assert (_count(model, CPUGELU), _count(model, CPULinear), _count(model, CPUSelectiveSSM),
            _count(model, CPUFeedForward)) == (4, 12, 2, 4)
    assert type(model.lm_head) is nn.Linear and type(model.blocks[0].mixer.in_proj) is nn.Linear  # not theirs
    assert (_count(plain, CPUGELU), _count(plain, CPULinear), _count(plain, CPUSelectiveSSM)) == (0, 0, 0)
    assert model.config == before == cfg  # the config names no kernel
    ours, theirs = model.state_dict(), plain.state_dict()
    assert list(ours) == list(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    x, y = torch.randint(0, 50, (3, 32)), torch.randint(0, 50, (3, 32))
    losses = [m(idx=x, targets=y).loss.item() for m in (plain, model)]
    assert abs(losses[0] - losses[1]) < 1e-5


def test_accelerate_with_no_kernels_or_the_wrong_device_changes_nothing():
    model = build_model(_hybrid())
    assert accelerate(model, ()) == {}
    with pytest.raises(ConfigError, match="kernels=linear: the kernel computes float32 on the CPU, and this run is "
                                          "bfloat16 on cpu"):
        accelerate(model, ("scan", "linear"), device_type="cpu", dtype="bfloat16")
    assert (_count(model, CPULinear), _count(model, CPUSelectiveSSM)) == (0, 0)  # refused before any swap


def test_parse_kernels():
    assert parse_kernels("all") == KERNELS == ("attention", "gelu", "linear", "scan")
    assert parse_kernels("attention, linear") == ("attention", "linear")
    assert parse_kernels("scan,gelu") == ("gelu", "scan")  # in KERNELS' order
    assert parse_kernels("none") == parse_kernels("") == ()
    with pytest.raises(ConfigError, match="kernels: unknown kernel 'cuda'; give none, all, or a comma-separated list "
                                          "of attention, gelu, linear, scan"):
        parse_kernels("attention,cuda")


@pytest.mark.parametrize("kernels, device_type, dtype, said", [
    (("gelu",), "cpu", "bfloat16", "kernels=gelu: the kernel computes float32 on the CPU, and this run is bfloat16 "
                                   "on cpu; leave gelu out of kernels"),
    (("attention",), "cpu", "bfloat16", "kernels=attention: the kernel computes float32 on the CPU, and this run is "
                                        "bfloat16 on cpu"),
    (("attention",), "cuda", "float32", "kernels=attention: the kernel computes float32 on the CPU, and this run is "
                                        "float32 on cuda"),
    (("scan",), "cuda", "bfloat16", "kernels=scan: the kernel computes on the CPU, and this run is bfloat16 on cuda; "
                                    "leave scan out of kernels"),
])
def test_check_device_refuses(kernels, device_type, dtype, said):
    with pytest.raises(ConfigError, match=said):
        check_device(kernels, device_type, dtype)


def test_check_device_lets_through():
    check_device(KERNELS, "cpu", "float32")
    check_device(("scan",), "cpu", "bfloat16")  # the scan computes in float32 whatever the run's dtype
    check_device((), "cuda", "bfloat16")


def test_a_run_config_reads_its_kernels(tmp_path):
    from tests.helpers import tiny_config

    assert tiny_config(tmp_path / "c.txt", tmp_path / "runs", kernels="attention,linear").kernels == "attention,linear"
    with pytest.raises(ConfigError, match="unknown kernel 'fast'"):
        tiny_config(tmp_path / "c.txt", tmp_path / "runs", kernels="fast")
