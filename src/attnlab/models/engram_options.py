"""EngramOptions: the option group of the Engram memory (a hashed n-gram lookup with a context gate, DeepSeek 2026;
``nn/engram.py``), mixed into GPTConfig as the other GPT-only groups of ``models/config.py`` are.

    engram_layers       which blocks hold an Engram sub-layer before their mixer ("1,3"; "" = none)
    engram_order        N: the n-grams of orders 2..N ending at each position are looked up
    engram_heads        K hash heads per order, each a table of engram_table_size rows
    engram_dim          the width retrieved per order (split over its K heads)
    engram_conv         the kernel of the causal depthwise convolution on the gated values (dilated by N)

The layer list is a comma-separated string, since option values are scalars (on the command line
``model.engram_layers=1,3``; in YAML ``engram_layers: "1,3"``).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.core.errors import ConfigError

MAX_ORDER = 8  # n-grams longer than 8 tokens are almost never seen twice in a corpus this lab trains on
MAX_HEADS = 64
MAX_CONV = 16
MAX_TABLE_SIZE = 2**31 - 1  # rows of one head's table (a row index fits an int32); memory is checked separately


@dataclass
class EngramOptions:
    """Engram: the blocks listed in engram_layers add x = x + Engram(Norm(x), ids) before their mixer, a memory of
    hashed 2..engram_order-grams of the (canonical) token ids, gated by the hidden state."""

    engram_layers: str = ""  # comma-separated 0-based indices of the blocks with an Engram sub-layer; "" = none
    engram_order: int = 3  # the longest n-gram looked up: orders 2..engram_order end at each position
    engram_heads: int = 4  # hash heads per n-gram order, each with its own table (collisions differ per head)
    engram_table_size: int = 4099  # rows of each head's table; a prime spreads the hashes best
    engram_dim: int = 64  # width retrieved per n-gram order, split evenly over its hash heads
    engram_conv: int = 4  # kernel of the causal depthwise convolution on the gated values (dilation engram_order)

    def engram_layer_indices(self) -> tuple[int, ...]:
        """The blocks with an Engram sub-layer, in the order given (the config has been validated)."""
        return tuple(int(part) for part in self.engram_layers.split(",") if part.strip())

    def is_engram_layer(self, index: int) -> bool:
        """Whether block ``index`` holds an Engram sub-layer."""
        return index in self.engram_layer_indices()

    def check_engram(self, n_layer: int, norm_position: str) -> None:
        """Range checks of the Engram options, with the model's depth and ``norm_position``; ConfigError (one line)."""
        if not isinstance(self.engram_layers, str):
            raise ConfigError(f"model.engram_layers must be comma-separated layer indices such as \"1,3\", "
                              f"got {self.engram_layers!r}")
        parts = [part.strip() for part in self.engram_layers.split(",")] if self.engram_layers.strip() else []
        if not all(part.isdigit() and len(part) < 10 for part in parts):
            raise ConfigError(f"model.engram_layers={self.engram_layers!r}: give comma-separated layer indices "
                              "such as \"1,3\" (0-based)")
        indices = [int(part) for part in parts]
        outside = [i for i in indices if i >= n_layer]
        if outside:
            raise ConfigError(f"model.engram_layers names layer {outside[0]}, and the model has layers 0.."
                              f"{n_layer - 1} (n_layer={n_layer})")
        if len(set(indices)) != len(indices):
            raise ConfigError(f"model.engram_layers={self.engram_layers!r} names a layer twice")
        if indices and norm_position != "pre":
            raise ConfigError("model.engram_layers needs norm_position=pre (an Engram block is a pre-norm block)")
        for key, low, high in (("engram_order", 2, MAX_ORDER), ("engram_heads", 1, MAX_HEADS),
                               ("engram_table_size", 1, MAX_TABLE_SIZE), ("engram_dim", 1, None),
                               ("engram_conv", 1, MAX_CONV)):
            value = getattr(self, key)
            if value < low or (high is not None and value > high):
                bound = f"{low} to {high:,}" if high is not None else f">= {low}"
                raise ConfigError(f"model.{key} must be {bound}, got {value}")
        if self.engram_dim % self.engram_heads != 0:
            raise ConfigError(f"model.engram_heads={self.engram_heads} does not divide "
                              f"model.engram_dim={self.engram_dim}")

    def unused_engram_options(self) -> list[tuple[str, str]]:
        """(option, why) for the Engram's sizes set while no layer has one."""
        return self._unless(bool(self.engram_layers.strip()), "no Engram layers (engram_layers is empty)",
                            "engram_order", "engram_heads", "engram_table_size", "engram_dim", "engram_conv")

    def engram_parameters(self, d_model: int) -> int:
        """Parameters of the Engram layers: per layer (N-1) K M D/K table entries and the two projections."""
        width = (self.engram_order - 1) * self.engram_dim
        per_layer = width * self.engram_table_size + 2 * width * d_model
        return len(self.engram_layer_indices()) * per_layer
