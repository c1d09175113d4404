"""Model configs: one class per family, composed from the shared option groups below.

    ModelConfig            the base: ``family``, the discriminator; every family config subclasses it
    TransformerOptions     n_layer, d_model, dropout, bias, init_std
      AttentionOptions     n_head, n_kv_head, attn_backend (a route of nn/attention/kernels.py), qk_norm
      NormOptions          norm, norm_position, norm_eps
      FFNOptions           d_ff, activation
    SequenceOptions        block_size (the longest sequence)
    PositionOptions        positions, rope_theta
    VocabularyOptions      vocab_size, tie_embeddings
    ClassifierOptions      n_classes, pooling
    ImageOptions           image_size, in_channels
    MixerOptions           mixer (attention, latent attention, SSM, hybrid) and its sizes   (GPT only)
    MoEOptions             mixture-of-experts feed-forward                                  (GPT only)
    ResidualOptions        residual scheme (hyper-connections, mHC, attention residuals)    (GPT only)

Each family (``models/<family>/config.py``) takes the groups it uses and nothing else, and its
``validate`` is the one place its options are checked; a group's checks take what they need of the rest as
arguments. An option of another family is refused in one line naming it and the family; so is an option of this
family that the chosen blocks do not use (``unused_options``: ``model.d_latent`` with ``mixer=attention``),
whatever its value, when a new file or the command line gives it. Files that attnlab wrote (a saved config.json,
a run's config.yaml: dumps of every option) are read with ``dump=True``, where an unused option at its default is
what the dump lists, not a choice; those of earlier versions still load (``core/legacy.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from attnlab.core.errors import ConfigError
from attnlab.core.schema import did_you_mean, from_dict
from attnlab.nn.attention.kernels import check_route

# 1: the flat schema (every family's options in one class); 2: one class per family; 3: no kernel options
CONFIG_VERSION = 3


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
    def from_mapping(data: Mapping[str, Any], prefix: str = "model.", dump: bool = False) -> ModelConfig:
        """The family's config from a mapping (a YAML section, the command line's ``model.*``); see the module
        docstring. An option of another family, or one the chosen blocks never read, is a one-line ConfigError.

        ``dump``: a mapping attnlab wrote (config.json, a run's config.yaml), of any version: another family's
        options (version 1 wrote them all) are dropped, and unused options are reset to their defaults.
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
            elif not dump:
                raise ConfigError(f"{prefix}{key} is not an option of family {family}")
        config = from_dict(cls, kept, prefix=prefix, check=False)
        if dump:
            config = config.without_unused()
        config.validate()
        if not dump:
            config.refuse_unused(kept, prefix)
        return config

    # -- checking --------------------------------------------------------------------------------

    def validate(self) -> None:
        """Range checks and the family's rules, then no unused option away from its default; raises ConfigError
        (one line)."""
        defaults = self.defaults()
        for key, why in self.unused_options():
            if getattr(self, key) != defaults[key]:
                raise ConfigError(f"model.{key}={getattr(self, key)!r} is not used: {why}")

    def refuse_unused(self, given: Mapping[str, Any], prefix: str = "model.") -> None:
        """ConfigError where ``given`` (the options a file or command line set) holds one the chosen blocks never
        read, whatever its value: ``model.d_latent=null`` with ``mixer=attention`` is a mistake, not a default."""
        for key, why in self.unused_options():
            if key in given:
                raise ConfigError(f"{prefix}{key} is not used: {why}")

    def unused_options(self) -> list[tuple[str, str]]:
        """(option, why) for this family's options that the chosen blocks never read."""
        return []

    def attention_needs(self) -> dict[str, str]:
        """What this model asks of an attention route besides causal self-attention (``nn.attention.kernels``'
        FEATURES), each with the option that asks it; families with attention say."""
        return {}

    @classmethod
    def defaults(cls) -> dict[str, Any]:  # {option: its default}
        return {f.name: f.default for f in dataclasses.fields(cls)}

    def without_unused(self) -> ModelConfig:
        """This config with every unused option back at its default."""
        defaults = self.defaults()
        return dataclasses.replace(self, **{key: defaults[key] for key, _ in self.unused_options()})

    def changed(self) -> dict[str, Any]:
        """The options set away from their defaults, and the family: what a new file needs to say of this config."""
        defaults = self.defaults()
        return {k: v for k, v in dataclasses.asdict(self).items() if k == "family" or v != defaults[k]}

    @staticmethod
    def _unless(used: bool, why: str, *keys: str) -> list[tuple[str, str]]:
        """``(key, why)`` for each of ``keys``, if ``used`` is False."""
        return [] if used else [(key, why) for key in keys]


def at_least(config: Any, minimum: int, *keys: str) -> None:
    """Raise ConfigError unless each of ``keys`` of ``config`` is None or >= ``minimum``."""
    for key in keys:
        value = getattr(config, key)
        if value is not None and value < minimum:
            raise ConfigError(f"model.{key} must be >= {minimum}, got {value}")


# ------------------------------------------------------------------------------ the option groups


@dataclass
class AttentionOptions:
    """Heads: n_head, n_kv_head (grouped-query attention when fewer), the route that computes attention
    (``nn/attention/kernels.py``), and QK-norm (each head's queries and keys RMS-normalised, with a learned gain,
    before positions and scores)."""
    n_head: int = 4  # attention heads per layer (each of d_model / n_head dimensions)
    n_kv_head: int | None = None  # key/value heads: None = n_head (MHA); 1 = MQA; in between = GQA
    # the route that computes attention, each the same function: eager (the reference), sdpa, tiled (O(T) memory)
    attn_backend: Literal["eager", "sdpa", "tiled"] = "sdpa"
    qk_norm: bool = False  # RMSNorm of each head's queries and keys (Dehghani et al. 2023, OLMo 2)


@dataclass
class NormOptions:
    """The normalisation: LayerNorm or RMSNorm, before (pre) or after (post) each sub-layer, and its epsilon."""
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"  # LayerNorm (centred, with a bias) or RMSNorm (scale only)
    norm_position: Literal["pre", "post"] = "pre"  # pre: x + f(norm(x)) (GPT-2); post: norm(x + f(x)) (Vaswani)
    norm_eps: float = 1e-5  # the epsilon under the norm's square root


@dataclass
class FFNOptions:
    """The feed-forward width (d_ff) and its activation."""
    d_ff: int | None = None  # the feed-forward's hidden width; None = 4 d_model (gelu/relu) or 8/3 d_model (swiglu)
    # the feed-forward's nonlinearity: gelu (exact), gelu_tanh (GPT-2's), relu, relu2 (ReLU^2), swiglu (gated)
    activation: Literal["gelu", "gelu_tanh", "relu", "relu2", "swiglu"] = "gelu"


@dataclass
class TransformerOptions(AttentionOptions, NormOptions, FFNOptions):
    """What every transformer stack has: depth, width, heads, norms, feed-forward, dropout, init."""

    n_layer: int = 4  # blocks (each a mixer and a feed-forward)
    d_model: int = 128  # width of the residual stream
    dropout: float = 0.0  # dropout probability on the embeddings and each sub-layer's output; 0 = none
    bias: bool = True  # biases in the linear layers and norms (nanoGPT's bias=False drops them)
    init_std: float = 0.02  # standard deviation of the normal initialisation of the weights

    @property
    def head_dim(self) -> int:
        """d_model / n_head."""
        return self.d_model // self.n_head

    def check_transformer(self, needs: Mapping[str, str]) -> None:
        """Range checks of the transformer options, and that ``attn_backend`` computes what the model's attention
        ``needs`` (``ModelConfig.attention_needs``); ConfigError naming the option."""
        at_least(self, 1, "n_layer", "n_head", "d_model", "d_ff")
        if self.d_model % self.n_head != 0:
            raise ConfigError(f"model.n_head={self.n_head} does not divide model.d_model={self.d_model}")
        kv = self.n_head if self.n_kv_head is None else self.n_kv_head
        if kv < 1 or self.n_head % kv != 0:
            raise ConfigError(f"model.n_kv_head={kv} must be >= 1 and divide model.n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.norm_eps <= 0 or self.init_std <= 0:
            raise ConfigError("model.norm_eps and model.init_std must be > 0")
        check_route(self.attn_backend, needs, self.head_dim, f"model.attn_backend={self.attn_backend}")

    def needs_of(self, causal: bool, positions: str, mixer: str = "attention") -> dict[str, str]:
        """``attention_needs`` of a transformer whose self-attention is ``causal`` (or attends both ways), with
        ``positions`` and, in a GPT, ``mixer``."""
        kv = self.n_head if self.n_kv_head is None else self.n_kv_head
        needs = {"bidirectional": f"family={self.family}"} if not causal else {}
        if self.dropout > 0:
            needs["dropout"] = f"model.dropout={self.dropout}"
        if kv != self.n_head:
            needs["gqa"] = f"model.n_kv_head={kv}"
        if positions in ("alibi", "relative"):
            needs["bias"] = f"positions={positions}"
        if mixer == "latent":
            needs["latent"] = "mixer=latent"
        return needs


@dataclass
class SequenceOptions:
    """The context length: the most positions the model sees at once."""
    block_size: int = 256  # context length: the most positions the model sees at once


@dataclass
class PositionOptions:
    """How positions enter: learned, sinusoidal, RoPE (with its base), ALiBi, relative, or none."""
    # added to the embeddings (learned, sinusoidal), rotating q and k (rope), a score bias (alibi, relative), or none
    positions: Literal["learned", "sinusoidal", "rope", "alibi", "relative", "none"] = "learned"
    rope_theta: float = 10000.0  # RoPE's base: pair i of a head rotates by position * theta^(-2i / head_dim)

    def check_positions(self, head_dim: int) -> None:
        """Range checks of the position options (RoPE needs an even ``head_dim``)."""
        if self.rope_theta <= 0:
            raise ConfigError(f"model.rope_theta must be > 0, got {self.rope_theta}")
        if self.positions == "rope" and head_dim % 2 != 0:
            raise ConfigError(f"RoPE needs an even head dimension, got d_model/n_head={head_dim}")


@dataclass
class VocabularyOptions:
    """Vocabulary size (filled from the tokenizer) and whether the output head is tied to the embedding."""
    vocab_size: int | None = None  # filled from the tokenizer when a run builds the model
    tie_embeddings: bool = True  # the output head reuses the token embedding matrix (its transpose)


@dataclass
class ClassifierOptions:
    """Number of classes (filled from the data) and how a sequence is pooled for them."""
    n_classes: int | None = None  # filled from the data's labels when a run builds the model
    pooling: Literal["cls", "mean"] = "cls"  # sequence summary: the [CLS] token or the mean of tokens


@dataclass
class ImageOptions:
    """Image size and number of channels."""
    image_size: int = 28  # side of the square input image, in pixels
    in_channels: int = 1  # colour channels: 1 grey-scale, 3 RGB

    def check_image(self, n_classes: int | None = None) -> None:
        """Range checks of the image options (and of ``n_classes``, for a classifier)."""
        at_least(self, 1, "image_size", "in_channels")
        if n_classes is not None and n_classes < 2:
            raise ConfigError(f"model.n_classes must be >= 2 for classification, got {n_classes}")


@dataclass
class MixerOptions:
    """The token mixer: multi-head attention, multi-head latent attention (DeepSeek-V2), a selective SSM
    (Mamba), or a hybrid stack where every hybrid_attention_every-th layer is attention, the rest SSM. The
    SSM's sizes."""

    mixer: Literal["attention", "latent", "ssm", "hybrid"] = "attention"  # each block's token mixer (see above)
    hybrid_attention_every: int = 2  # mixer=hybrid: every k-th layer is attention, the others SSM
    d_latent: int | None = None  # MLA: compressed key/value size (None = 4 * head_dim)
    d_rope: int | None = None  # MLA: decoupled RoPE size per head (None = head_dim / 2)
    q_latent: int | None = None  # MLA: compressed query size (None = no query compression)
    ssm_d_state: int = 16  # SSM: state size N per channel
    ssm_d_conv: int = 4  # SSM: width of the causal depthwise convolution before the scan
    ssm_expand: int = 2  # SSM: inner width = ssm_expand * d_model

    def layer_mixer(self, index: int) -> str:
        """The token mixer of layer ``index``: "attention", "latent" or "ssm"."""
        if self.mixer == "hybrid":
            return "attention" if (index + 1) % self.hybrid_attention_every == 0 else "ssm"
        return self.mixer

    def check_mixer(self, positions: str, head_dim: int) -> None:
        """Range checks of the mixer options (latent and SSM sizes, the hybrid's period), with the model's
        ``positions`` and ``head_dim``."""
        at_least(self, 1, "hybrid_attention_every", "ssm_d_state", "ssm_d_conv", "ssm_expand",
                  "d_latent", "d_rope", "q_latent")
        if self.mixer == "latent":
            if positions in ("rope", "relative"):
                raise ConfigError(f"mixer=latent applies its own decoupled RoPE and takes no positions={positions}; "
                                  "set positions to none, learned, sinusoidal or alibi")
            d_rope = self.d_rope or head_dim // 2
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
            *self._unless(has_ssm, f"SSM options, and mixer={self.mixer}", "ssm_d_state", "ssm_d_conv", "ssm_expand"),
            *self._unless(self.mixer == "hybrid", f"for mixer=hybrid, and mixer={self.mixer}",
                          "hybrid_attention_every"),
            *self._unless(self.mixer != "ssm", "mixer=ssm has no attention", "attn_backend", "n_kv_head"),
            *self._unless(self.mixer in ("attention", "hybrid"), f"multi-head attention's, and mixer={self.mixer}",
                          "qk_norm"),
        ]


@dataclass
class MoEOptions:
    """moe_experts > 0 replaces the feed-forward of every moe_every-th block by a mixture of experts."""

    moe_experts: int = 0  # experts per MoE layer; 0 = dense feed-forwards
    moe_top_k: int = 2  # experts each token is routed to
    moe_capacity_factor: float | None = 1.25  # an expert's capacity / its even share of tokens; None = never drop
    moe_every: int = 1  # every k-th block has experts (1 = all)
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

    residual: Literal["standard", "hyper", "mhc", "attnres"] = "standard"  # how sub-layers join the stream (above)
    residual_streams: int = 4  # parallel streams for hyper / mhc

    def check_residual(self, norm_position: str) -> None:
        """Range checks of the residual-scheme options, with the blocks' ``norm_position``."""
        if self.residual != "standard" and norm_position != "pre":
            raise ConfigError(f"residual={self.residual} needs norm_position=pre (it mixes pre-norm sub-layers)")
        if self.residual_streams < 1 or (self.residual == "mhc" and self.residual_streams < 2):
            raise ConfigError(f"model.residual_streams must be >= 1 (>= 2 for mhc), got {self.residual_streams}")

    def unused_residual_options(self) -> list[tuple[str, str]]:
        """(option, why) for stream options set with the standard residual."""
        return self._unless(self.residual in ("hyper", "mhc"), f"streams of hyper/mhc, and residual={self.residual}",
                            "residual_streams")


def unused_rope_theta(positions: str, mixer: str = "attention") -> list[tuple[str, str]]:
    """rope_theta is read by RoPE positions (and by latent attention's decoupled RoPE) only."""
    used = positions == "rope" or mixer == "latent"
    return ModelConfig._unless(used, f"RoPE's base, and positions={positions}", "rope_theta")


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
