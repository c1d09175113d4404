"""Mixture-of-experts statistics between two log events: balance loss, each expert layer's share of
token assignments per expert, and the share dropped by the capacity limit."""

from __future__ import annotations

from typing import Any

import torch


class MoELog:
    """Running sums of mixture-of-experts statistics between two log events (no host sync until flush)."""

    def __init__(self) -> None:
        self.n, self.aux, self.load, self.dropped = 0, 0.0, 0.0, 0.0

    def add(self, stats: list) -> None:
        """Accumulate one step's expert statistics."""
        self.n += 1
        self.aux = self.aux + sum(s.aux_loss.detach() for s in stats) / len(stats)
        self.load = self.load + torch.stack([s.expert_load.detach() for s in stats])  # (expert layers, E)
        self.dropped = self.dropped + sum(s.dropped_fraction.detach() for s in stats) / len(stats)

    def flush(self) -> dict[str, Any]:
        """Means since the last flush: balance loss, each expert layer's share of assignments per expert,
        dropped share."""
        if self.n == 0:
            return {}
        record = {"moe_aux_loss": float(self.aux) / self.n,
                  "expert_load": [[round(v / self.n, 5) for v in layer] for layer in self.load.tolist()],
                  "moe_dropped_fraction": float(self.dropped) / self.n}
        self.__init__()
        return record
