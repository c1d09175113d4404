"""benchmarks/compile_options.py: every option of a GPT under torch.compile against eager. Two option sets here, through
aot_eager: the table, the JSON, and the graph breaks a dropless MoE layer makes (it sizes its buffer by the busiest
expert, a tensor value)."""

from __future__ import annotations

import json

from tests.helpers import bench_here


def test_option_sets_compile_and_match_eager(tmp_path, capfd):
    assert bench_here("compile_options", "--only", "gpt2: base", "gpt2: moe_experts", "gpt2: positions=alibi",
                      "--results", str(tmp_path)) == 0
    rows = {r["options"]: r for r in json.loads((tmp_path / "compile_options.json").read_text())["rows"]}
    assert set(rows) == {"gpt2: positions=alibi", next(n for n in rows if n.startswith("gpt2: moe_experts"))}
    for r in rows.values():
        assert "error" not in r and r["loss_diff"] < 1e-5 and r["grad_diff"] < 1e-4
    assert rows["gpt2: positions=alibi"]["graph_breaks"] == 0
    assert next(r for n, r in rows.items() if "moe" in n)["graph_breaks"] > 0
    assert "option sets: 0 failed to compile" in capfd.readouterr().out


def test_no_matching_option_set_is_one_line_and_exit_2(tmp_path, capfd):
    assert bench_here("compile_options", "--only", "no-such-option", "--results", str(tmp_path)) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no option set matches" in err[0] and not list(tmp_path.iterdir())
