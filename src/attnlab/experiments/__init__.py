"""Experiments that back the course's claims with measurements: ``attnlab experiment NAME``.

Each experiment is a module with ``NAME`` (the CLI name), ``CLAIM`` (one line) and
``run(out: Path, quick: bool) -> dict``; it writes ``results.json``, plots and a ``report.md`` into
``out`` (see ``attnlab.experiments.base``). ``EXPERIMENTS`` maps names to modules, imported lazily.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXPERIMENTS: dict[str, str] = {
    "hand-trace": "attnlab.experiments.hand_trace",
    "vit-vs-cnn": "attnlab.experiments.vit_vs_cnn",
    "sqrt-dk": "attnlab.experiments.sqrt_dk",
    "permutation": "attnlab.experiments.permutation",
    "long-range": "attnlab.experiments.long_range",
    "flash-memory": "attnlab.experiments.flash_memory",
    "moe-vs-dense": "attnlab.experiments.moe_vs_dense",
    "ssm-vs-attention": "attnlab.experiments.ssm_vs_attention",
    "structure-discovery": "attnlab.experiments.structure_discovery",
    "scaling": "attnlab.experiments.scaling",
    "word-vectors": "attnlab.experiments.word_vectors",
    "chomsky": "attnlab.experiments.chomsky",
    "faithfulness": "attnlab.experiments.faithfulness",
    "grokking": "attnlab.experiments.grokking",
    "induction-heads": "attnlab.experiments.induction_heads",
    "attention-saliency": "attnlab.experiments.attention_saliency",
    "micrograph-saliency": "attnlab.experiments.micrograph_saliency",
    "ssl-recipe": "attnlab.experiments.ssl_recipe",
}


def load(name: str) -> ModuleType:
    """The module of the experiment called ``name`` (imported on first use)."""
    return importlib.import_module(EXPERIMENTS[name])
