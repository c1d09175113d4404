"""``init_from=RUN``: a new run of any family starts from the weights (and tokenizer) of a trained one.

``init_weights`` copies every tensor of the pre-trained model whose name and shape fit the new one; a head of
another size (10 classes after 2, a classifier after a masked-LM) starts fresh, and the log says what was loaded
and what is fresh. A folder that is not a model, a model of another family, or one that shares no tensor with
the new model (another architecture) is refused in one line, the first two before any data is read. A ViT
may also start from a masked autoencoder (family mae) or a DINO student (family dino), whose encoders carry the ViT's
tensor names, and a captioner from any of the three.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.core.errors import ConfigError

# family -> the other families whose weights can start it (their encoders carry the ViT's names)
PRETRAINS = {"vit": ("mae", "dino"), "captioner": ("vit", "mae", "dino")}


def check_init_from(folder: str | Path, family: str) -> None:
    """Refuse, in one line and before any work, an ``init_from`` that is not a model folder of ``family``."""
    from attnlab.models.base import read_config

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ConfigError(f"init_from={folder} is not a run or model folder (no config.json)")
    pretrained = read_config(folder).family
    if pretrained != family and pretrained not in PRETRAINS.get(family, ()):
        raise ConfigError(f"init_from={folder} holds a {pretrained} model; this run trains a {family}")


def init_weights(model, folder: str | Path) -> tuple[list[str], list[str]]:
    """Copy into ``model`` every tensor of the model in ``folder`` whose name and shape fit; returns (loaded,
    fresh) tensor names. ConfigError when nothing fits (another architecture)."""
    from attnlab.models.registry import from_pretrained

    pretrained = from_pretrained(folder).state_dict()
    own = model.state_dict()
    fits = {k: v for k, v in pretrained.items() if k in own and own[k].shape == v.shape}
    if not fits:
        raise ConfigError(f"init_from={folder}: no tensor of that model fits this one (another architecture)")
    model.load_state_dict(fits, strict=False)
    return sorted(fits), sorted(k for k in own if k not in fits)


def init_weights_line(model, folder: str | Path) -> str:
    """``init_weights``, then the log line saying how many tensors were loaded and which start fresh."""
    loaded, fresh = init_weights(model, folder)
    shown = f", {len(fresh)} fresh ({', '.join(fresh[:4])}{' ...' if len(fresh) > 4 else ''})" if fresh else ""
    return f"init_from {folder}: {len(loaded)} tensors loaded{shown}"
