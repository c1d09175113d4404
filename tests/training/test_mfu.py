"""Model FLOPs per token (PaLM appendix B) and MFU against a measured, cached peak."""

import json

import pytest
import torch

from attnlab.models import GPTConfig, build_model
from attnlab.training import mfu as mfu_module
from attnlab.training.mfu import active_parameters, flops_per_token, mfu, peak_flops


def _model(**extra):
    torch.manual_seed(0)
    return build_model(GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, d_model=128, bias=False,
                                   **extra))


def test_flops_per_token_is_6n_plus_attention_term():
    m = _model()
    n = m.num_parameters() - m.positions.weight.numel()  # the position table is a lookup, not a matmul
    assert active_parameters(m) == n
    assert flops_per_token(m) == 6 * n + 12 * 4 * 128 * 64


def test_moe_counts_only_the_active_experts():
    dense, moe = _model(), _model(moe_experts=4, moe_top_k=1)
    assert moe.num_parameters() > 2.5 * dense.num_parameters()
    router = sum(b.ffn.router.weight.numel() for b in moe.blocks)
    assert active_parameters(moe) == active_parameters(dense) + router  # top-1 of 4 equal-width experts


def test_ssm_layers_have_no_attention_term():
    ssm = _model(mixer="ssm", positions="none")
    assert flops_per_token(ssm) == 6 * active_parameters(ssm)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A cache folder of this test's own (no peak measured by an earlier test in the worker), and no hardware
    bound: these tests pin the measured peak."""
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(mfu_module, "hardware_peak_flops", lambda dtype, threads: None)


@pytest.mark.parametrize("flags, dtype, per_cycle", [
    ({"avx", "avx2", "fma"}, torch.float32, 32),
    ({"avx", "avx2", "fma"}, torch.bfloat16, 32),  # no native bf16: converted and computed at the fp32 rate
    ({"avx2", "fma", "avx512f"}, torch.float32, 64),
    ({"avx2", "fma", "avx512f", "avx512_bf16"}, torch.bfloat16, 128),
    ({"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"}, torch.bfloat16, 1024),
    ({"sse2"}, torch.float32, 8),
])
def test_flops_per_cycle_follows_the_widest_unit(flags, dtype, per_cycle):
    assert mfu_module.flops_per_cycle(flags, dtype) == per_cycle


def test_the_hardware_bound_reads_cpuinfo(monkeypatch):
    cpuinfo = "processor\t: 0\ncpu MHz\t\t: 2000.000\nflags\t\t: fpu avx avx2 fma\ncpu MHz\t\t: 3000.0\n"
    monkeypatch.setattr(mfu_module, "_cpuinfo_text", lambda: cpuinfo)
    monkeypatch.setattr(mfu_module.Path, "read_text", _no_cpufreq(mfu_module.Path.read_text))
    mfu_module.hardware_peak_flops.cache_clear()
    try:
        peak, how = mfu_module.hardware_peak_flops(torch.float32, 2)
    finally:
        mfu_module.hardware_peak_flops.cache_clear()
    assert peak == 2 * 32 * 3.0e9 and "2 threads x 32 FLOP/cycle x 3 GHz" in how


def _no_cpufreq(read_text):
    def read(self, *args, **kwargs):
        if "cpufreq" in str(self):
            raise OSError("no cpufreq here")
        return read_text(self, *args, **kwargs)
    return read


def test_the_peak_is_the_larger_of_the_bound_and_the_measurement(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(mfu_module, "measure_peak_flops", lambda dtype, device: 5e10)
    monkeypatch.setattr(mfu_module, "hardware_peak_flops", lambda dtype, threads: (2e11, "bound"))
    assert peak_flops(torch.float32) == 2e11  # a measurement on a loaded machine cannot pull it below the bound
    monkeypatch.setattr(mfu_module, "hardware_peak_flops", lambda dtype, threads: (1e10, "bound"))
    assert peak_flops(torch.float32) == 5e10  # a reported clock below the boost clock: the measurement rules
    assert peak_flops(torch.float32, hardware=False) == 5e10


def test_no_run_logs_mfu_above_100_percent(tmp_path):
    """Unpatched: this machine's own peak (hardware bound and best measurement), a real run of the default model."""
    from attnlab.training.runs import read_metrics
    from attnlab.training.trainer import Trainer
    from tests.helpers import tiny_config, write_corpus

    cfg = tiny_config(write_corpus(tmp_path / "c.txt"), tmp_path / "runs", name="m", max_iters=20, log_interval=5)
    trainer = Trainer(cfg)
    trainer.train()
    logged = [r for r in read_metrics(trainer.run_dir) if "mfu" in r]
    assert logged and all(0 < r["mfu"] <= 1.0 for r in logged), logged
    assert all(r["mfu"] == pytest.approx(r["tokens_per_s"] * trainer.flops_per_unit / r["peak_flops"]) for r in logged)


def test_peak_is_measured_once_and_cached(monkeypatch, fresh_cache):
    calls = []
    monkeypatch.setattr(mfu_module, "measure_peak_flops", lambda dtype, device: calls.append(dtype) or 1e11)
    assert peak_flops(torch.float32) == 1e11
    assert peak_flops(torch.float32) == 1e11
    assert calls == [torch.float32]
    cached = json.loads(mfu_module._peak_cache_file("cpu").read_text())
    assert cached == {"float32": 1e11}


def test_a_peak_cached_on_one_cpu_is_not_used_on_another(monkeypatch, fresh_cache):
    """The cache is keyed by the CPU's model name and flags, not by the host name alone (a virtual machine keeps
    its name on other hardware): another CPU measures its own peak."""
    monkeypatch.setattr(mfu_module, "measure_peak_flops", lambda dtype, device: 1e11)
    monkeypatch.setattr(mfu_module, "_cpuinfo_text", lambda: "model name\t: CPU A\nflags\t\t: fpu avx2 fma\n")
    assert peak_flops(torch.float32) == 1e11
    first = mfu_module._peak_cache_file("cpu")
    monkeypatch.setattr(mfu_module, "measure_peak_flops", lambda dtype, device: 3e11)
    monkeypatch.setattr(mfu_module, "_cpuinfo_text", lambda: "model name\t: CPU B\nflags\t\t: fpu avx512f\n")
    assert mfu_module._peak_cache_file("cpu") != first
    assert peak_flops(torch.float32) == 3e11  # measured anew, not read from CPU A's file
    assert json.loads(first.read_text()) == {"float32": 1e11}


def test_refresh_keeps_the_best_measurement(monkeypatch, fresh_cache):
    """A peak first measured on a busy machine is raised by a later quiet measurement, never lowered."""
    values = iter([1e10, 5e10, 2e10])
    monkeypatch.setattr(mfu_module, "measure_peak_flops", lambda dtype, device: next(values))
    assert peak_flops(torch.float32) == 1e10
    assert peak_flops(torch.float32, refresh=True) == 5e10
    assert peak_flops(torch.float32, refresh=True) == 5e10  # the 2e10 re-measurement does not lower it
    assert json.loads(mfu_module._peak_cache_file("cpu").read_text()) == {"float32": 5e10}


def test_trainer_remeasures_a_peak_below_what_it_achieves(tmp_path, monkeypatch, fresh_cache):
    from attnlab.training.trainer import Trainer
    from tests.helpers import tiny_config, write_corpus

    values = iter([1.0, 1e15])  # a cached 1 FLOP/s peak would give MFU far above 100%
    monkeypatch.setattr(mfu_module, "measure_peak_flops", lambda dtype, device: next(values))
    trainer = Trainer(tiny_config(write_corpus(tmp_path / "c.txt"), tmp_path / "runs", name="m", max_iters=2))
    assert trainer.mfu(1000.0) == pytest.approx(1000.0 * trainer.flops_per_unit / 1e15)
    assert trainer.mfu(1e9) == pytest.approx(1e9 * trainer.flops_per_unit / 1e15)  # measured again only once


def test_measured_peak_is_plausible():
    flops = mfu_module.measure_peak_flops(torch.float32, size=256, seconds=0.05)
    assert 1e8 < flops < 1e14


def test_mfu_value_and_trainer_logs_it(tmp_path, monkeypatch, fresh_cache):
    assert mfu(1000.0, 1e6, 1e10) == pytest.approx(0.1)
    monkeypatch.setattr(mfu_module, "measure_peak_flops", lambda dtype, device: 1e11)
    from attnlab.training.runs import read_metrics
    from attnlab.training.trainer import Trainer
    from tests.helpers import tiny_config, write_corpus

    trainer = Trainer(tiny_config(write_corpus(tmp_path / "c.txt"), tmp_path / "runs", name="m", max_iters=10))
    trainer.train()
    logged = [r for r in read_metrics(trainer.run_dir) if "mfu" in r]
    assert logged and all(r["mfu"] == pytest.approx(r["tokens_per_s"] * trainer.flops_per_unit / 1e11)
                          for r in logged)


def test_measuring_the_peak_leaves_the_global_rng_alone():
    """Otherwise a run that measured the peak would draw other dropout masks than its resumption."""
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    mfu_module.measure_peak_flops(torch.float32, size=64, seconds=0.01)
    assert torch.equal(torch.rand(3), expected)
