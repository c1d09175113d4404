"""Model configs: one class per family, composed from the shared option groups below.

    ModelConfig            the base: ``family``, the discriminator; every family config subclasses it
    TransformerOptions     n_layer, d_model, dropout, bias, init_std, linear_backend
      AttentionOptions     n_head, n_kv_head, attn_backend
      NormOptions          norm, norm_position, norm_eps
      FFNOptions           d_ff, activation, act_backend
    SequenceOptions        block_size (the longest sequence)
    PositionOptions        positions, rope_theta
    VocabularyOptions      vocab_size, tie_embeddings
    ClassifierOptions      n_classes, pooling
    ImageOptions           image_size, in_channels
    MixerOptions           mixer (attention, latent attention, SSM, hybrid) and its sizes   (GPT only)
    MoEOptions             mixture-of-experts feed-forward                                  (GPT only)
    ResidualOptions        residual scheme (hyper-connections, mHC, attention residuals)    (GPT only)

Each family (``models/<family>/config.py``) takes the groups it uses and nothing else, and its
``validate`` is the one place its options are checked. An option of another family is refused in one
line naming it; so is an option of this family that the chosen blocks do not use (``unused_options``:
``model.d_latent`` with ``mixer=attention``). Files written before the per-family configs (version 1:
one flat schema carrying every family's options at their defaults) still load: ``from_mapping``
with ``legacy=True`` drops what the family never read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from attnlab.core.errors import ConfigError
from attnlab.core.schema import did_you_mean, from_dict

CONFIG_VERSION = 2  # 1: the flat schema (every family's options in one class); 2: one class per family

# the defaults of the flat version-1 schema: an option of another family found at this value in a file is
# a leftover of that schema (it was written for every family), not a choice, and is dropped
LEGACY_DEFAULTS: dict[str, Any] = {
    "family": "gpt", "vocab_size": None, "block_size": 256, "n_layer": 4, "n_head": 4, "n_kv_head": None,
    "d_model": 128, "d_ff": None, "activation": "gelu", "norm": "layernorm", "norm_position": "pre",
    "norm_eps": 1e-5, "positions": "learned", "rope_theta": 10000.0, "dropout": 0.0, "bias": True,
    "attn_backend": "sdpa", "mixer": "attention", "hybrid_attention_every": 2, "d_latent": None, "d_rope": None,
    "q_latent": None, "ssm_d_state": 16, "ssm_d_conv": 4, "ssm_expand": 2, "residual": "standard",
    "residual_streams": 4, "moe_experts": 0, "moe_top_k": 2, "moe_capacity_factor": 1.25, "moe_every": 1,
    "moe_aux_weight": 0.01, "moe_z_weight": 0.001, "tie_embeddings": True, "init_std": 0.02, "n_classes": None,
    "pooling": "cls", "n_segments": 2, "n_decoder_layer": None, "share_embeddings": True, "image_size": 28,
    "patch_size": 4, "in_channels": 1, "cnn_width": 32, "cnn_stages": 3, "cnn_blocks": 2, "cnn_norm": "batch",
    "inputs": "features", "n_features": None, "n_elements": None, "head": "regression", "n_outputs": 1,
}


CAUSAL_FAMILIES = ("gpt", "seq2seq", "captioner")  # the families with causal self-attention (a decoder)


@dataclass
class ModelConfig:
    """The base of every family's config. ``ModelConfig.from_mapping(data)`` builds the family's class."""

    family: str = "gpt"
    # filled as each family's config class is defined: importing ``attnlab.models`` (which any import
    # of this module does first) defines them all
    families: ClassVar[dict[str, type[ModelConfig]]] = {}

    def __init_subclass__(cls, family: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if family is not None:
            ModelConfig.families[family] = cls

    # -- building --------------------------------------------------------------------------------

    @staticmethod
    def for_family(family: Any) -> type[ModelConfig]:
        """The config class of ``family``; an unknown name is a one-line ConfigError."""
        if not isinstance(family, str) or family not in ModelConfig.families:
            names = sorted(ModelConfig.families)
            hint = did_you_mean(str(family), names) or f"; choose one of {names}"
            raise ConfigError(f"unknown model family '{family}'{hint}")
        return ModelConfig.families[family]

    @staticmethod
    def option_names() -> set[str]:
        """Every option of every family (for ``key=value`` overrides that leave out ``model.``)."""
        return {f.name for cls in ModelConfig.families.values() for f in dataclasses.fields(cls)}

    @staticmethod
    def from_mapping(data: Mapping[str, Any], prefix: str = "model.", legacy: bool = False) -> ModelConfig:
        """The family's config from a mapping (a YAML section, a config.json); see the module docstring.

        ``legacy``: the mapping was written by the flat schema (config.json version 1), so options the
        family or its blocks did not use are dropped whatever their value, as that schema ignored them.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"'{prefix.rstrip('.')}' must be a mapping of model options, got {data!r}")
        family = data.get("family", "gpt")
        cls = ModelConfig.for_family(family)
        own = {f.name for f in dataclasses.fields(cls)}
        every = ModelConfig.option_names()
        kept: dict[str, Any] = {}
        for key, value in data.items():
            if key in own or key not in every:  # an unknown key is reported by from_dict, with a hint
                kept[key] = value
            elif not (legacy or (key in LEGACY_DEFAULTS and value == LEGACY_DEFAULTS[key])):
                raise ConfigError(f"{prefix}{key} is not an option of family {family}")
        config = from_dict(cls, kept, prefix=prefix, check=False)
        if legacy:
            config = config.without_unused()
        config.validate()
        return config

    # -- checking --------------------------------------------------------------------------------

    def validate(self) -> None:
        """Range checks and the family's rules, then no unused option; raises ConfigError (one line)."""
        unused = self.unused_options()
        if unused:
            key, why = unused[0]
            raise ConfigError(f"model.{key}={getattr(self, key)!r} is not used: {why}")

    def unused_options(self) -> list[tuple[str, str]]:
        """(option, why) for options set away from their default that the chosen blocks never read."""
        return []

    def without_unused(self) -> ModelConfig:
        """This config with every unused option back at its default."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{key: defaults[key] for key, _ in self.unused_options()})

    def _unless(self, used: bool, why: str, *keys: str) -> list[tuple[str, str]]:
        """The ``keys`` that differ from their defaults, if ``used`` is False."""
        if used:
            return []
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return [(key, why) for key in keys if getattr(self, key) != defaults[key]]


def at_least(config: Any, minimum: int, *keys: str) -> None:
    """Raise ConfigError unless each of ``keys`` of ``config`` is None or >= ``minimum``."""
    for key in keys:
        value = getattr(config, key)
        if value is not None and value < minimum:
            raise ConfigError(f"model.{key} must be >= {minimum}, got {value}")


# ------------------------------------------------------------------------------ the option groups


@dataclass
class AttentionOptions:
    """Heads: n_head, n_kv_head (grouped-query attention when fewer), the attention backend, and QK-norm
    (each head's queries and keys RMS-normalised, with a learned gain, before positions and scores)."""
    n_head: int = 4
    n_kv_head: int | None = None  # None = n_head (MHA); 1 = MQA; in between = GQA
    attn_backend: Literal["eager", "sdpa", "tiled", "cpu-fused"] = "sdpa"
    qk_norm: bool = False  # Dehghani et al. 2023 / OLMo 2: RMSNorm(q), RMSNorm(k) per head


@dataclass
class NormOptions:
    """The normalisation: LayerNorm or RMSNorm, before (pre) or after (post) each sub-layer, and its epsilon."""
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_position: Literal["pre", "post"] = "pre"
    norm_eps: float = 1e-5


@dataclass
class FFNOptions:
    """The feed-forward width (d_ff), its activation, and how the exact GELU is computed."""
    d_ff: int | None = None  # None = 4 d_model (gelu/relu) or 8/3 d_model (swiglu)
    activation: Literal["gelu", "gelu_tanh", "relu", "relu2", "swiglu"] = "gelu"  # gelu_tanh: GPT-2's; relu2: ReLU^2
    act_backend: Literal["torch", "cpu-fused"] = "torch"  # cpu-fused: the exact GELU in C++ (nn/gelu_cpu.py)


@dataclass
class TransformerOptions(AttentionOptions, NormOptions, FFNOptions):
    """What every transformer stack has: depth, width, heads, norms, feed-forward, dropout, init."""

    n_layer: int = 4
    d_model: int = 128
    dropout: float = 0.0
    bias: bool = True
    init_std: float = 0.02
    linear_backend: Literal["torch", "cpu-fused"] = "torch"  # cpu-fused: the blocks' products in C++ (nn/linear_cpu.py)

    @property
    def head_dim(self) -> int:
        """d_model / n_head."""
        return self.d_model // self.n_head

    def check_transformer(self) -> None:
        """Range checks of the transformer options; ConfigError naming the option."""
        at_least(self, 1, "n_layer", "n_head", "d_model", "d_ff")
        if self.d_model % self.n_head != 0:
            raise ConfigError(f"model.n_head={self.n_head} does not divide model.d_model={self.d_model}")
        kv = self.n_head if self.n_kv_head is None else self.n_kv_head
        if kv < 1 or self.n_head % kv != 0:
            raise ConfigError(f"model.n_kv_head={kv} must be >= 1 and divide model.n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.attn_backend == "cpu-fused":
            self.check_cpu_fused(kv)
        if self.linear_backend == "cpu-fused" and self.d_model % 16:
            raise ConfigError(f"model.linear_backend=cpu-fused needs d_model a multiple of 16, got {self.d_model}; "
                              "use linear_backend=torch")
        if self.act_backend == "cpu-fused" and self.activation != "gelu":
            raise ConfigError(f"model.act_backend=cpu-fused computes the exact GELU; model.activation="
                              f"{self.activation}: use act_backend=torch")
        if self.norm_eps <= 0 or self.init_std <= 0:
            raise ConfigError("model.norm_eps and model.init_std must be > 0")

    def check_cpu_fused(self, kv: int) -> None:
        """ConfigError where attn_backend=cpu-fused would never run its kernel (nn/attention/cpu_fused.py)."""
        from attnlab.nn.attention.cpu_fused import check_config

        check_config(self.family in CAUSAL_FAMILIES, self.family, self.dropout, kv, self.n_head, self.head_dim,
                     getattr(self, "positions", "none"), getattr(self, "mixer", "attention"))


@dataclass
class SequenceOptions:
    """The context length: the most positions the model sees at once."""
    block_size: int = 256  # context length: the most positions the model sees at once


@dataclass
class PositionOptions:
    """How positions enter: learned, sinusoidal, RoPE (with its base), ALiBi, relative, or none."""
    positions: Literal["learned", "sinusoidal", "rope", "alibi", "relative", "none"] = "learned"
    rope_theta: float = 10000.0

    def check_positions(self) -> None:
        """Range checks of the position options (RoPE needs an even head dimension)."""
        if self.rope_theta <= 0:
            raise ConfigError(f"model.rope_theta must be > 0, got {self.rope_theta}")
        head_dim = getattr(self, "head_dim", 0)
        if self.positions == "rope" and head_dim % 2 != 0:
            raise ConfigError(f"RoPE needs an even head dimension, got d_model/n_head={head_dim}")


@dataclass
class VocabularyOptions:
    """Vocabulary size (filled from the tokenizer) and whether the output head is tied to the embedding."""
    vocab_size: int | None = None  # filled from the tokenizer when a run builds the model
    tie_embeddings: bool = True


@dataclass
class ClassifierOptions:
    """Number of classes (filled from the data) and how a sequence is pooled for them."""
    n_classes: int | None = None  # filled from the data's labels when a run builds the model
    pooling: Literal["cls", "mean"] = "cls"  # sequence summary: the [CLS] token or the mean of tokens


@dataclass
class ImageOptions:
    """Image size and number of channels."""
    image_size: int = 28  # side of the square input image, in pixels
    in_channels: int = 1  # 1 grey-scale, 3 RGB

    def check_image(self) -> None:
        """Range checks of the image options."""
        at_least(self, 1, "image_size", "in_channels")
        n_classes = getattr(self, "n_classes", None)
        if n_classes is not None and n_classes < 2:
            raise ConfigError(f"model.n_classes must be >= 2 for classification, got {n_classes}")


@dataclass
class MixerOptions:
    """The token mixer: multi-head attention, multi-head latent attention (DeepSeek-V2), a selective SSM
    (Mamba), or a hybrid stack where every hybrid_attention_every-th layer is attention, the rest SSM. The
    SSM's scan: the chunked form in PyTorch ops, or attnlab's C++ loop for CPUs (built on first use)."""

    mixer: Literal["attention", "latent", "ssm", "hybrid"] = "attention"
    hybrid_attention_every: int = 2
    d_latent: int | None = None  # MLA: compressed key/value size (None = 4 * head_dim)
    d_rope: int | None = None  # MLA: decoupled RoPE size per head (None = head_dim / 2)
    q_latent: int | None = None  # MLA: compressed query size (None = no query compression)
    ssm_d_state: int = 16
    ssm_d_conv: int = 4
    ssm_expand: int = 2
    ssm_scan: Literal["chunked", "cpu-fused"] = "chunked"  # cpu-fused: one C++ loop per pass (nn/scan_cpu.py)

    def layer_mixer(self, index: int) -> str:
        """The token mixer of layer ``index``: "attention", "latent" or "ssm"."""
        if self.mixer == "hybrid":
            return "attention" if (index + 1) % self.hybrid_attention_every == 0 else "ssm"
        return self.mixer

    def check_mixer(self) -> None:
        """Range checks of the mixer options (latent and SSM sizes, the hybrid's period)."""
        at_least(self, 1, "hybrid_attention_every", "ssm_d_state", "ssm_d_conv", "ssm_expand",
                  "d_latent", "d_rope", "q_latent")
        positions, backend = getattr(self, "positions", "none"), getattr(self, "attn_backend", "sdpa")
        if self.mixer == "latent":
            if positions in ("rope", "relative"):
                raise ConfigError(f"mixer=latent applies its own decoupled RoPE and takes no positions={positions}; "
                                  "set positions to none, learned, sinusoidal or alibi")
            if backend == "tiled":
                raise ConfigError("mixer=latent has no tiled kernel; set model.attn_backend to eager or sdpa")
            d_rope = self.d_rope or getattr(self, "head_dim", 0) // 2
            if d_rope % 2 != 0:
                raise ConfigError(f"model.d_rope must be even, got {d_rope}")
        if self.mixer == "ssm" and positions in ("rope", "alibi", "relative"):
            raise ConfigError(f"positions={positions} acts inside attention, and mixer=ssm has none; "
                              "use positions=none (the SSM is causal and order-aware by itself)")

    def unused_mixer_options(self) -> list[tuple[str, str]]:
        """(option, why) for mixer options set away from their default that the chosen mixer never reads."""
        has_ssm = self.mixer in ("ssm", "hybrid")
        return [
            *self._unless(self.mixer == "latent", f"latent-attention sizes, and mixer={self.mixer}",
                          "d_latent", "d_rope", "q_latent"),
            *self._unless(has_ssm, f"SSM options, and mixer={self.mixer}", "ssm_d_state", "ssm_d_conv", "ssm_expand",
                          "ssm_scan"),
            *self._unless(self.mixer == "hybrid", f"for mixer=hybrid, and mixer={self.mixer}",
                          "hybrid_attention_every"),
            *self._unless(self.mixer != "ssm", "mixer=ssm has no attention", "attn_backend", "n_kv_head"),
            *self._unless(self.mixer in ("attention", "hybrid"), f"multi-head attention's, and mixer={self.mixer}",
                          "qk_norm"),
        ]


@dataclass
class MoEOptions:
    """moe_experts > 0 replaces the feed-forward of every moe_every-th block by a mixture of experts."""

    moe_experts: int = 0
    moe_top_k: int = 2
    moe_capacity_factor: float | None = 1.25  # None = never drop tokens
    moe_every: int = 1
    moe_aux_weight: float = 0.01  # load-balancing loss weight (Switch: 1e-2)
    moe_z_weight: float = 0.001  # router z-loss weight (ST-MoE: 1e-3)

    def is_moe_layer(self, index: int) -> bool:
        """Layers moe_every-1, 2 moe_every-1, ... use experts (all layers when moe_every = 1)."""
        return self.moe_experts > 0 and (index + 1) % self.moe_every == 0

    def check_moe(self) -> None:
        """Range checks of the mixture-of-experts options."""
        if self.moe_experts < 0 or self.moe_every < 1:
            raise ConfigError("model.moe_experts must be >= 0 and model.moe_every >= 1")
        if self.moe_experts > 0 and not 1 <= self.moe_top_k <= self.moe_experts:
            raise ConfigError(f"model.moe_top_k={self.moe_top_k} must be between 1 and moe_experts={self.moe_experts}")
        if self.moe_capacity_factor is not None and self.moe_capacity_factor <= 0:
            raise ConfigError(f"model.moe_capacity_factor must be > 0 (or null), got {self.moe_capacity_factor}")
        if self.moe_aux_weight < 0 or self.moe_z_weight < 0:
            raise ConfigError("model.moe_aux_weight and model.moe_z_weight must be >= 0")

    def unused_moe_options(self) -> list[tuple[str, str]]:
        """(option, why) for expert options set while the model has no experts."""
        return self._unless(self.moe_experts > 0, "no experts (moe_experts=0)", "moe_top_k", "moe_capacity_factor",
                            "moe_every", "moe_aux_weight", "moe_z_weight")


@dataclass
class ResidualOptions:
    """How sub-layer outputs join the residual stream: x + f(norm(x)) ("standard"), hyper-connections
    (Zhu et al. 2024), manifold-constrained HC (mHC, DeepSeek 2025), attention residuals (Kimi 2026)."""

    residual: Literal["standard", "hyper", "mhc", "attnres"] = "standard"
    residual_streams: int = 4  # parallel streams for hyper / mhc

    def check_residual(self) -> None:
        """Range checks of the residual-scheme options."""
        if self.residual != "standard" and getattr(self, "norm_position", "pre") != "pre":
            raise ConfigError(f"residual={self.residual} needs norm_position=pre (it mixes pre-norm sub-layers)")
        if self.residual_streams < 1 or (self.residual == "mhc" and self.residual_streams < 2):
            raise ConfigError(f"model.residual_streams must be >= 1 (>= 2 for mhc), got {self.residual_streams}")

    def unused_residual_options(self) -> list[tuple[str, str]]:
        """(option, why) for stream options set with the standard residual."""
        return self._unless(self.residual in ("hyper", "mhc"), f"streams of hyper/mhc, and residual={self.residual}",
                            "residual_streams")


def unused_rope_theta(config: Any) -> list[tuple[str, str]]:
    """rope_theta is read by RoPE positions (and by latent attention's decoupled RoPE) only."""
    used = config.positions == "rope" or getattr(config, "mixer", None) in ("latent",)
    return config._unless(used, f"RoPE's base, and positions={config.positions}", "rope_theta")


def check_head(config: Any) -> None:
    """A classification head needs >= 2 classes (when the data has filled them in)."""
    if config.head == "classification" and config.n_classes is not None and config.n_classes < 2:
        raise ConfigError(f"model.n_classes must be >= 2 for classification, got {config.n_classes}")


def unused_head_options(config: Any) -> list[tuple[str, str]]:
    """n_classes is read by a classification head only, n_outputs by a regression head only."""
    return [
        *config._unless(config.head == "classification", f"classification only, and head={config.head}", "n_classes"),
        *config._unless(config.head == "regression", f"regression only, and head={config.head}", "n_outputs"),
    ]
