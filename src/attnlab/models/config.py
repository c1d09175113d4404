"""ModelConfig: one validated schema for every family (GPT now; BERT, seq2seq, ViT build on it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab.core.errors import ConfigError

CONFIG_VERSION = 1


@dataclass
class ModelConfig:
    """Architecture hyper-parameters. Field names follow the equations (d_model, n_head, d_ff)."""

    family: str = "gpt"
    vocab_size: int | None = None  # filled from the tokenizer when a run builds the model
    block_size: int = 256  # context length: the most positions the model sees at once
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None  # None = n_head (MHA); 1 = MQA; in between = GQA
    d_model: int = 128
    d_ff: int | None = None  # None = 4 d_model (gelu/relu) or 8/3 d_model (swiglu)
    activation: Literal["gelu", "relu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_position: Literal["pre", "post"] = "pre"
    norm_eps: float = 1e-5
    positions: Literal["learned", "sinusoidal", "rope", "alibi", "relative", "none"] = "learned"
    rope_theta: float = 10000.0
    dropout: float = 0.0
    bias: bool = True
    attn_backend: Literal["eager", "sdpa", "tiled"] = "sdpa"
    # token mixer: multi-head attention, multi-head latent attention (DeepSeek-V2), a selective SSM
    # (Mamba), or a hybrid stack where every hybrid_attention_every-th layer is attention, the rest SSM
    mixer: Literal["attention", "latent", "ssm", "hybrid"] = "attention"
    hybrid_attention_every: int = 2
    d_latent: int | None = None  # MLA: compressed key/value size (None = 4 * head_dim)
    d_rope: int | None = None  # MLA: decoupled RoPE size per head (None = head_dim / 2)
    q_latent: int | None = None  # MLA: compressed query size (None = no query compression)
    ssm_d_state: int = 16
    ssm_d_conv: int = 4
    ssm_expand: int = 2
    # how sub-layer outputs join the residual stream: x + f(norm(x)) ("standard"), hyper-connections
    # (Zhu et al. 2024), manifold-constrained HC (mHC, DeepSeek 2025), attention residuals (Kimi 2026)
    residual: Literal["standard", "hyper", "mhc", "attnres"] = "standard"
    residual_streams: int = 4  # parallel streams for hyper / mhc
    # mixture of experts: moe_experts > 0 replaces the feed-forward of every moe_every-th block
    moe_experts: int = 0
    moe_top_k: int = 2
    moe_capacity_factor: float | None = 1.25  # None = never drop tokens
    moe_every: int = 1
    moe_aux_weight: float = 0.01  # load-balancing loss weight (Switch: 1e-2)
    moe_z_weight: float = 0.001  # router z-loss weight (ST-MoE: 1e-3)
    tie_embeddings: bool = True
    init_std: float = 0.02
    # -- classification heads (bert, vit, cnn) ---------------------------------------------------
    n_classes: int | None = None  # filled from the data's labels when a run builds the model
    pooling: Literal["cls", "mean"] = "cls"  # sequence summary: the [CLS] token or the mean of tokens
    # -- bert --------------------------------------------------------------------------------------
    n_segments: int = 2  # segment (token type) embeddings, A/B sentences; 0 = none
    # -- seq2seq -----------------------------------------------------------------------------------
    n_decoder_layer: int | None = None  # decoder depth; None = n_layer (the encoder's)
    share_embeddings: bool = True  # one embedding table for source and target (one shared vocabulary)
    # -- vit / cnn ---------------------------------------------------------------------------------
    image_size: int = 28  # side of the square input image, in pixels
    patch_size: int = 4  # side of a square ViT patch: (image_size / patch_size)^2 tokens + [CLS]
    in_channels: int = 1  # 1 grey-scale, 3 RGB
    cnn_width: int = 32  # cnn: channels of the first stage (doubled at each later stage)
    cnn_stages: int = 3  # cnn: stages of residual blocks; each after the first halves the resolution
    cnn_blocks: int = 2  # cnn: residual blocks per stage
    cnn_norm: Literal["batch", "group"] = "batch"  # cnn: BatchNorm or GroupNorm after every conv
    # -- continuous / set inputs (encoder) ---------------------------------------------------------
    inputs: Literal["features", "set"] = "features"  # (B, T, F) feature vectors, or (element, value) sets
    n_features: int | None = None  # features: F values per step; filled from the data by a run
    n_elements: int | None = None  # set: element types (ids 0..n_elements-1); filled from the data by a run
    head: Literal["regression", "classification"] = "regression"  # MSE on n_outputs values, or cross-entropy
    n_outputs: int = 1  # regression: targets per example

    def validate(self) -> None:
        """Range checks that types alone cannot express; raises ConfigError (one line)."""
        from attnlab.core.schema import did_you_mean
        from attnlab.models.registry import MODEL_FAMILIES, model_class

        if self.family not in MODEL_FAMILIES:
            hint = did_you_mean(self.family, MODEL_FAMILIES) or f"; choose one of {sorted(MODEL_FAMILIES)}"
            raise ConfigError(f"unknown model family '{self.family}'{hint}")
        for key in ("block_size", "n_layer", "n_head", "d_model"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ConfigError(f"model.vocab_size must be >= 1, got {self.vocab_size}")
        if self.d_model % self.n_head != 0:
            raise ConfigError(f"model.n_head={self.n_head} does not divide model.d_model={self.d_model}")
        kv = self.n_head if self.n_kv_head is None else self.n_kv_head
        if kv < 1 or self.n_head % kv != 0:
            raise ConfigError(f"model.n_kv_head={kv} must be >= 1 and divide model.n_head={self.n_head}")
        if self.positions == "rope" and (self.d_model // self.n_head) % 2 != 0:
            raise ConfigError(f"RoPE needs an even head dimension, got d_model/n_head={self.d_model // self.n_head}")
        if self.d_ff is not None and self.d_ff < 1:
            raise ConfigError(f"model.d_ff must be >= 1, got {self.d_ff}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.mixer == "latent" and self.positions in ("rope", "relative"):
            raise ConfigError(f"mixer=latent applies its own decoupled RoPE and takes no positions={self.positions}; "
                              "set positions to none, learned, sinusoidal or alibi")
        if self.mixer == "latent" and self.attn_backend == "tiled":
            raise ConfigError("mixer=latent has no tiled kernel; set model.attn_backend to eager or sdpa")
        if self.mixer == "ssm" and self.positions in ("rope", "alibi", "relative"):
            raise ConfigError(f"positions={self.positions} acts inside attention, and mixer=ssm has none; "
                              "use positions=none (the SSM is causal and order-aware by itself)")
        if self.hybrid_attention_every < 1 or min(self.ssm_d_state, self.ssm_d_conv, self.ssm_expand) < 1:
            raise ConfigError("model.hybrid_attention_every, ssm_d_state, ssm_d_conv and ssm_expand must be >= 1")
        for key in ("d_latent", "d_rope", "q_latent"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if self.mixer == "latent" and (self.d_rope or self.head_dim // 2) % 2 != 0:
            raise ConfigError(f"model.d_rope must be even, got {self.d_rope or self.head_dim // 2}")
        if self.residual != "standard" and self.norm_position != "pre":
            raise ConfigError(f"residual={self.residual} needs norm_position=pre (it mixes pre-norm sub-layers)")
        if self.residual_streams < 1 or (self.residual == "mhc" and self.residual_streams < 2):
            raise ConfigError(f"model.residual_streams must be >= 1 (>= 2 for mhc), got {self.residual_streams}")
        if self.moe_experts < 0 or self.moe_every < 1:
            raise ConfigError("model.moe_experts must be >= 0 and model.moe_every >= 1")
        if self.moe_experts > 0 and not 1 <= self.moe_top_k <= self.moe_experts:
            raise ConfigError(f"model.moe_top_k={self.moe_top_k} must be between 1 and moe_experts={self.moe_experts}")
        if self.moe_capacity_factor is not None and self.moe_capacity_factor <= 0:
            raise ConfigError(f"model.moe_capacity_factor must be > 0 (or null), got {self.moe_capacity_factor}")
        if self.moe_aux_weight < 0 or self.moe_z_weight < 0:
            raise ConfigError("model.moe_aux_weight and model.moe_z_weight must be >= 0")
        if self.norm_eps <= 0 or self.init_std <= 0 or self.rope_theta <= 0:
            raise ConfigError("model.norm_eps, model.init_std and model.rope_theta must be > 0")
        for key in ("n_classes", "n_decoder_layer"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if self.n_segments < 0 or min(self.image_size, self.patch_size, self.in_channels) < 1:
            raise ConfigError("model.n_segments must be >= 0; image_size, patch_size, in_channels >= 1")
        model_class(self.family).check_config(self)  # the family's own rules

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def layer_mixer(self, index: int) -> str:
        """The token mixer of layer ``index``: "attention", "latent" or "ssm"."""
        if self.mixer == "hybrid":
            return "attention" if (index + 1) % self.hybrid_attention_every == 0 else "ssm"
        return self.mixer

    def is_moe_layer(self, index: int) -> bool:
        """Layers moe_every-1, 2 moe_every-1, ... use experts (all layers when moe_every = 1)."""
        return self.moe_experts > 0 and (index + 1) % self.moe_every == 0
