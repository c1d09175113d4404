"""TransformerLens's hook names for a GPT, and attnlab's points that hold the same tensors.

    TransformerLens                      attnlab                                  layout (TL -> attnlab)
    blocks.{i}.hook_resid_pre            blocks.{i}.hook_resid_pre                (B, T, C)
    blocks.{i}.ln1.hook_scale            blocks.{i}.norm_mixer.hook_scale         (B, T, 1)
    blocks.{i}.ln1.hook_normalized       blocks.{i}.norm_mixer.hook_normalized    (B, T, C)
    blocks.{i}.attn.hook_q / _k / _v     blocks.{i}.mixer.hook_q / _k / _v        (B, T, H, D) -> (B, H, T, D)
    blocks.{i}.attn.hook_attn_scores     blocks.{i}.mixer.hook_attn_scores        (B, H, T, S)
    blocks.{i}.attn.hook_pattern         blocks.{i}.mixer.hook_pattern            (B, H, T, S)
    blocks.{i}.attn.hook_z               blocks.{i}.mixer.hook_z                  (B, T, H, D) -> (B, H, T, D)
    blocks.{i}.attn.hook_result          blocks.{i}.mixer.hook_result             (B, T, H, C) -> (B, H, T, C)
    blocks.{i}.hook_attn_out             blocks.{i}.hook_mixer_out (alias hook_attn_out)   (B, T, C)
    blocks.{i}.hook_resid_mid            blocks.{i}.hook_resid_mid                (B, T, C)
    blocks.{i}.ln2.hook_scale / _normalized   blocks.{i}.norm_ffn.hook_scale / _normalized
    blocks.{i}.mlp.hook_pre / hook_post  blocks.{i}.ffn.hook_pre / hook_post      (B, T, d_ff)
    blocks.{i}.hook_mlp_out              blocks.{i}.hook_ffn_out (alias hook_mlp_out)      (B, T, C)
    blocks.{i}.hook_resid_post           blocks.{i}.hook_resid_post               (B, T, C)
    ln_final.hook_scale / _normalized    norm_f.hook_scale / hook_normalized

attnlab keeps heads on axis 1 at every per-head point (so a ``Site``'s head and positions index every one
alike); TransformerLens puts them on axis 2 for q, k, v, z and result. ``to_transformerlens`` turns an attnlab
cache into TransformerLens's names and layouts, so the two can be compared key by key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from torch import Tensor

# (TransformerLens's name, attnlab's name) with {i} for the block; heads on axis 2 in TransformerLens's layout
POINTS: tuple[tuple[str, str], ...] = (
    ("blocks.{i}.hook_resid_pre", "blocks.{i}.hook_resid_pre"),
    ("blocks.{i}.ln1.hook_scale", "blocks.{i}.norm_mixer.hook_scale"),
    ("blocks.{i}.ln1.hook_normalized", "blocks.{i}.norm_mixer.hook_normalized"),
    ("blocks.{i}.attn.hook_q", "blocks.{i}.mixer.hook_q"),
    ("blocks.{i}.attn.hook_k", "blocks.{i}.mixer.hook_k"),
    ("blocks.{i}.attn.hook_v", "blocks.{i}.mixer.hook_v"),
    ("blocks.{i}.attn.hook_attn_scores", "blocks.{i}.mixer.hook_attn_scores"),
    ("blocks.{i}.attn.hook_pattern", "blocks.{i}.mixer.hook_pattern"),
    ("blocks.{i}.attn.hook_z", "blocks.{i}.mixer.hook_z"),
    ("blocks.{i}.attn.hook_result", "blocks.{i}.mixer.hook_result"),
    ("blocks.{i}.hook_attn_out", "blocks.{i}.hook_mixer_out"),
    ("blocks.{i}.hook_resid_mid", "blocks.{i}.hook_resid_mid"),
    ("blocks.{i}.ln2.hook_scale", "blocks.{i}.norm_ffn.hook_scale"),
    ("blocks.{i}.ln2.hook_normalized", "blocks.{i}.norm_ffn.hook_normalized"),
    ("blocks.{i}.mlp.hook_pre", "blocks.{i}.ffn.hook_pre"),
    ("blocks.{i}.mlp.hook_post", "blocks.{i}.ffn.hook_post"),
    ("blocks.{i}.hook_mlp_out", "blocks.{i}.hook_ffn_out"),
    ("blocks.{i}.hook_resid_post", "blocks.{i}.hook_resid_post"),
    ("ln_final.hook_scale", "norm_f.hook_scale"),
    ("ln_final.hook_normalized", "norm_f.hook_normalized"),
)
HEADS_ON_AXIS_2 = ("hook_q", "hook_k", "hook_v", "hook_z", "hook_result")  # in TransformerLens's layout


def _pattern(template: str) -> re.Pattern:
    return re.compile(re.escape(template).replace(re.escape("{i}"), r"(\d+)") + "$")


_TO_ATTNLAB = [(_pattern(tl), ours) for tl, ours in POINTS]
_TO_TL = [(_pattern(ours), tl) for tl, ours in POINTS]


def _translate(name: str, table: list[tuple[re.Pattern, str]], what: str) -> str:
    for pattern, template in table:
        m = pattern.match(name)
        if m:
            return template.format(i=m.group(1)) if m.groups() else template
    raise KeyError(f"{name!r} is not one of the {what} names of docs/lens.md's table")


def attnlab_name(tl_name: str) -> str:
    """``blocks.1.attn.hook_z`` -> ``blocks.1.mixer.hook_z``."""
    return _translate(tl_name, _TO_ATTNLAB, "TransformerLens")


def transformerlens_name(name: str) -> str:
    """``blocks.1.mixer.hook_z`` -> ``blocks.1.attn.hook_z``."""
    return _translate(name, _TO_TL, "attnlab")


def attnlab_points(n_layer: int) -> list[str]:
    """Every attnlab point of the table for a model of ``n_layer`` blocks, in model order."""
    per_block = [ours for _, ours in POINTS if "{i}" in ours]
    final = [ours for _, ours in POINTS if "{i}" not in ours]
    return [p.format(i=i) for i in range(n_layer) for p in per_block] + final


def to_transformerlens_layout(name: str, x: Tensor) -> Tensor:
    """An attnlab point's tensor in TransformerLens's layout: heads moved from axis 1 to axis 2 where it puts
    them there (q, k, v, z, result); the others as they are."""
    return x.transpose(1, 2) if name.rsplit(".", 1)[-1] in HEADS_ON_AXIS_2 else x


def to_transformerlens(cache: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An attnlab cache (``run_with_cache``) under TransformerLens's names and layouts; points outside the table
    (``hook_scores``, ...) are left out."""
    out = {}
    for name, x in cache.items():
        try:
            out[transformerlens_name(name)] = to_transformerlens_layout(name, x)
        except KeyError:
            continue
    return out
