"""What the explorer shows, per model family: attention maps and the model's own guesses.

One adapter per family, chosen from the run folder's ``config.json``:

* GPT: ``attention_maps(text)`` returns, for each attention layer, the probabilities
  P = softmax(QK^T/sqrt(d_k) + mask) of every head, (H, T, T) as nested lists, and
  ``next_token`` = softmax(logits[T-1]) restricted to its 10 largest entries.
* BERT: ``attention_maps(text, mask)``: the text as ``[CLS] pieces [SEP]``, bidirectional maps, and for
  every [MASK] (typed, or a position listed in ``mask``) the top 10 of softmax(MLM head(h_L[t])).
* ViT: ``image_maps(data, resize)``: an uploaded image (bytes, decoded with Pillow, bounded), the top 5
  classes of softmax(logits), the [CLS] -> patch attention P_l^h[0, 1:] per layer and head, and the
  rollout R[0, 1:] (inspect/rollout.py), all on the patch grid (gh, gw).
* seq2seq and cnn are not wired to the explorer: their adapter answers every model request with one
  clear line (HTTP 400), so the page still serves its toy and convolution tabs.

Every family gets its maps from ONE place, ``record_self_attention`` (attnlab.inspect.record): the
eager reference probabilities whatever backend runs the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnlab.core.errors import AttnlabError, CheckpointError, ConfigError, DataError
from attnlab.tokenizers.specials import encode_for

#: ceiling on tokens per request even for long-context models: the (L, H, T, T) maps go to the
#: browser as JSON, and 128^2 * L * H numbers is already megabytes for a 6x6 model
MAX_EXPLORER_TOKENS = 128
DIGITS = 5  # probabilities are sent rounded to 5 decimals (the heatmap needs far fewer)
EXAMPLES = ("To be, or not to be, that is the question.", "The quick brown fox jumps over the lazy dog.",
            "the quick brown fox jumps over the lazy dog", "the quick brown fox", "Hello, world.", "hello")


@dataclass
class ModelInfo:
    """What the page needs to know before the first request."""

    family: str
    supported: bool
    run_name: str
    n_layer: int
    n_head: int
    block_size: int
    max_tokens: int  # the longest input the explorer accepts (<= block_size)
    max_chars: int  # the longest text accepted (a bound checked before tokenising)
    vocab_size: int | None
    example: str = ""  # a text the tokenizer can encode, to fill the page's input box
    message: str = ""  # why the family is unsupported, when it is
    input: str = "text"  # what the page asks for: "text" or "image"
    image_size: int = 0  # vit: the side (pixels) the model takes
    in_channels: int = 0  # vit: 1 (grey) or 3 (RGB)
    max_upload_bytes: int = 0  # vit: the largest image file accepted
    mask_token: str = ""  # bert: the token the user types to ask for guesses
    warning: str = ""  # shown on the page: e.g. an imported model whose MLM head is a fresh init


def read_family(run_dir: Path) -> str:
    """The ``family`` field of the run's config.json, read without validating the rest."""
    file = run_dir / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{run_dir} has no config.json: not a trained run folder")
    try:
        family = json.loads(file.read_text(encoding="utf-8")).get("family", "gpt")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise CheckpointError(f"{file} is not a valid config.json ({type(e).__name__})") from e
    return str(family)


def record_self_attention(model: torch.nn.Module, **inputs: Any) -> tuple[list[int], list[torch.Tensor], Any]:
    """One forward pass under ``attnlab.inspect.record``: (block indices, per layer the self-attention
    probabilities of every head of the first row (H, T, T), the model's output)."""
    from attnlab.inspect.record import record

    with torch.no_grad(), record(model, what=("probs",)) as rec:
        out = model(**inputs)
    names = rec.select("self")
    return [rec.layer[n] for n in names], [rec.probs[n][0] for n in names], out


def rounded(t: torch.Tensor) -> list:
    """A tensor as nested lists of floats rounded to DIGITS decimals (in float64, so they print short)."""
    return t.double().round(decimals=DIGITS).tolist()


def top_k(probs: torch.Tensor, k: int, label: Any) -> list[dict[str, Any]]:
    """probs (V,) -> the k largest as [{"token": label(i), "id": i, "p": p}], most likely first."""
    top = torch.topk(probs, k=min(k, probs.numel()))
    return [{"token": label(int(i)), "id": int(i), "p": round(float(p), DIGITS)}
            for p, i in zip(top.values, top.indices)]


class ExplorerAdapter:
    """The interface the server calls. Subclasses answer for one family."""

    info: ModelInfo

    def attention_maps(self, text: str, mask: list[int] | None = None) -> dict[str, Any]:
        """The attention maps of ``text`` for the Text tab (tokens, layers[l][h][q][k], next tokens or masked
        guesses)."""
        raise ConfigError(self.info.message or f"the explorer takes an image for a {self.info.family} run, not text")

    def image_maps(self, data: bytes, resize: bool = False) -> dict[str, Any]:
        """The [CLS] -> patch maps of an image for the Image tab (per layer and head, the rollout, the top 5
        classes)."""
        raise ConfigError(self.info.message or f"the explorer takes text for a {self.info.family} run, not an image")

    def lens(self, text: str, ablate: list[tuple[int, int]], how: str = "zero") -> dict[str, Any]:
        """The Lens tab: next-token distributions with and without the ablated heads, and the logit lens."""
        raise ConfigError(self.info.message or f"the lens tab reads a gpt run; this one is {self.info.family}")

    def describe(self) -> dict[str, Any]:
        """What the page needs to know about the run (/api/info)."""
        return dict(self.info.__dict__)


class UnsupportedAdapter(ExplorerAdapter):
    """A run whose family the explorer cannot show yet: every model request is a clear 400."""

    def __init__(self, run_dir: Path, family: str) -> None:
        self.info = ModelInfo(
            family=family, supported=False, run_name=run_dir.name, n_layer=0, n_head=0, block_size=0,
            max_tokens=0, max_chars=0, vocab_size=None,
            message=f"this run's family '{family}' is not supported by the explorer (only gpt, bert, vit); "
                    "the toy and convolution tabs still work",
        )


class GPTAdapter(ExplorerAdapter):
    """Causal LM: attention maps of every layer/head and the next-token distribution."""

    def __init__(self, run_dir: Path, max_tokens: int = MAX_EXPLORER_TOKENS) -> None:
        from attnlab.training.runs import load_model_and_tokenizer

        self.model, self.tokenizer = load_model_and_tokenizer(run_dir)
        self.model.eval()
        c = self.model.config
        tokens = min(c.block_size, max_tokens)
        self.info = ModelInfo(
            family="gpt", supported=True, run_name=run_dir.name, n_layer=c.n_layer, n_head=c.n_head,
            block_size=c.block_size, max_tokens=tokens, max_chars=8 * tokens, vocab_size=c.vocab_size,
        )
        self.info.example = self._example_text()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, with one-line errors for empty, too long or out-of-vocabulary text."""
        info = self.info
        if not text:
            raise ConfigError("the text is empty: type at least one character")
        if len(text) > info.max_chars:
            raise ConfigError(f"the text has {len(text)} characters; the explorer takes at most {info.max_chars}")
        ids = self.tokenizer.encode(text)  # TokenizerError (one line) for characters outside the vocabulary
        if not ids:
            raise ConfigError("the text encodes to no tokens")
        if len(ids) > info.max_tokens:
            limit = "the model's context" if info.max_tokens == info.block_size else "the explorer's limit"
            raise ConfigError(f"the text is {len(ids)} tokens long, more than {limit} of {info.max_tokens}; "
                              "shorten it")
        return ids

    def _example_text(self) -> str:
        """The first of a few familiar lines that this tokenizer encodes and the model can take."""
        for text in EXAMPLES:
            try:
                if len(self.tokenizer.encode(text)) <= self.info.max_tokens:
                    return text
            except AttnlabError:  # a character outside a char vocabulary
                continue
        ids = list(range(min(self.info.max_tokens, 16, self.info.vocab_size or 0)))
        return self.tokenizer.decode(ids)

    def _forward_with_weights(self, ids: list[int]) -> tuple[list[int], list[torch.Tensor], torch.Tensor]:
        """One forward pass: (indices of the attention layers, their probs (H, T, T), logits (T, V)).
        A state-space layer has no attention module, so it has no map (and no index here)."""
        layers, maps, out = record_self_attention(self.model, idx=torch.tensor([ids]))
        return layers, maps, out.logits[0].float()  # (T, V)

    def attention_maps(self, text: str, mask: list[int] | None = None) -> dict[str, Any]:
        """{tokens, layer_index, layers: [layer][head][query][key], next_token: top 10}."""
        if mask:
            raise ConfigError("masking tokens is for a bert run; a gpt predicts the next token")
        ids = self.encode(text)
        layer_index, maps, logits = self._forward_with_weights(ids)
        return {
            "tokens": [self.tokenizer.decode([i]) for i in ids],
            "layer_index": layer_index,
            "layers": [m.round(decimals=DIGITS).tolist() for m in maps],
            "next_token": self.next_token_top10(logits[-1]),
        }

    def lens(self, text: str, ablate: list[tuple[int, int]], how: str = "zero") -> dict[str, Any]:
        """The lens tab: the logit lens after the text and the next token with heads ablated
        (``attnlab.inspect.lens.explorer_view``)."""
        from attnlab.inspect.lens import check_heads, explorer_view

        heads = [(int(layer), int(h)) for layer, h in ablate]
        check_heads(self.model, heads, "ablate")
        if len(set(heads)) != len(heads):
            raise ConfigError("ablate names a head twice")
        view = explorer_view(self.model, self.tokenizer, self.encode(text), heads, how)
        return {**view, "layer_names": [layer["name"] for layer in view["layers"]]}

    def next_token_top10(self, logits: torch.Tensor) -> list[dict[str, Any]]:
        """softmax(logits) (V,) -> the 10 most likely next tokens, most likely first."""
        return top_k(torch.softmax(logits, dim=-1), 10, lambda i: self.tokenizer.decode([i]))


MASK_EXAMPLES = ("the quick brown [MASK] jumps over the lazy dog.", "To be, or not to [MASK], that is the question.",
                 "the [MASK] fox")


def read_imported(run_dir: Path) -> dict[str, Any]:
    """``imported.json`` of a folder written by ``attnlab import-hf`` ({} for any other folder)."""
    try:
        data = json.loads((Path(run_dir) / "imported.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class BertAdapter(ExplorerAdapter):
    """Masked LM: [CLS] text [SEP], bidirectional maps, and the MLM head's top 10 at every [MASK]."""

    def __init__(self, run_dir: Path, max_tokens: int = MAX_EXPLORER_TOKENS) -> None:
        from attnlab.training.runs import load_model_and_tokenizer

        self.model, self.tokenizer = load_model_and_tokenizer(run_dir)
        self.model.eval()
        if getattr(self.tokenizer, "mask_id", None) is None:
            raise CheckpointError(f"{run_dir}: a bert run needs a WordPiece tokenizer with [MASK]")
        c = self.model.config
        tokens = min(c.block_size, max_tokens)
        self.info = ModelInfo(
            family="bert", supported=True, run_name=run_dir.name, n_layer=c.n_layer, n_head=c.n_head,
            block_size=c.block_size, max_tokens=tokens, max_chars=8 * tokens, vocab_size=c.vocab_size,
            mask_token="[MASK]",
        )
        self.info.example = next((t for t in MASK_EXAMPLES if self._fits(t)), "[MASK]")
        fresh = read_imported(run_dir).get("fresh_heads", [])
        if any(name.startswith("mlm") for name in fresh):
            self.info.warning = ("this model was imported without its masked-LM head: the head is randomly "
                                 "initialised, so the [MASK] guesses below mean nothing (the attention maps do)")

    def _fits(self, text: str) -> bool:
        ids = encode_for(self.model, self.tokenizer, text)
        return len(ids) <= self.info.max_tokens and self.tokenizer.mask_id in ids \
            and self.tokenizer.unk_id not in ids

    def encode(self, text: str, mask: list[int] | None = None) -> list[int]:
        """[CLS] ids [SEP] (``tokenizers.specials.encode_for``, as every text path encodes a BERT's text), with
        the positions in ``mask`` (counted with [CLS] = 0) set to [MASK]."""
        info, tok = self.info, self.tokenizer
        if not text.strip():
            raise ConfigError("the text is empty: type at least one word")
        if len(text) > info.max_chars:
            raise ConfigError(f"the text has {len(text)} characters; the explorer takes at most {info.max_chars}")
        ids = encode_for(self.model, tok, text)
        if len(ids) > info.max_tokens:
            raise ConfigError(f"the text is {len(ids)} tokens long with [CLS] and [SEP], more than the limit of "
                              f"{info.max_tokens}; shorten it")
        for t in mask or []:
            if not 0 < t < len(ids) - 1:
                raise ConfigError(f"cannot mask position {t}: the text's tokens are at positions 1 to {len(ids) - 2}")
            ids[t] = tok.mask_id
        return ids

    def attention_maps(self, text: str, mask: list[int] | None = None) -> dict[str, Any]:
        """{tokens, layer_index, layers: [layer][head][query][key], masked: [{position, guesses: top 10}]}."""
        ids = self.encode(text, mask)
        layer_index, maps, out = record_self_attention(self.model, input_ids=torch.tensor([ids]), with_mlm=True)
        logits = out.mlm_logits[0].float()  # (T, V)
        label = lambda i: self.tokenizer.decode([i])  # noqa: E731
        masked = [{"position": t, "guesses": top_k(torch.softmax(logits[t], dim=-1), 10, label)}
                  for t, i in enumerate(ids) if i == self.tokenizer.mask_id]
        return {
            "tokens": [label(i) for i in ids],
            "layer_index": layer_index,
            "layers": [rounded(m) for m in maps],
            "masked": masked,
        }


#: bounds on an uploaded image: the file itself, and its pixel dimensions (read from the header before
#: decoding, so a small file that decompresses to a huge bitmap is refused without being decoded)
MAX_UPLOAD_BYTES = 2 * 1024 * 1024
MAX_IMAGE_SIDE = 4096


def decode_image(data: bytes, channels: int, size: int, resize: bool) -> torch.Tensor:
    """Image file bytes -> uint8 (C, size, size); one-line DataError for anything else."""
    import io

    import numpy as np
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise DataError("the upload is empty: choose an image file")
    if len(data) > MAX_UPLOAD_BYTES:
        raise DataError(f"the image file is {len(data)} bytes; the explorer takes at most {MAX_UPLOAD_BYTES}")
    try:
        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
            if w > MAX_IMAGE_SIDE or h > MAX_IMAGE_SIDE:
                raise DataError(f"the image is {w}x{h} pixels; the explorer takes at most "
                                f"{MAX_IMAGE_SIDE}x{MAX_IMAGE_SIDE}")
            if (w, h) != (size, size) and not resize:
                raise DataError(f"the image is {w}x{h} pixels but the model takes {size}x{size}; "
                                "tick 'resize' to scale it")
            img = img.convert("L" if channels == 1 else "RGB")
            if img.size != (size, size):
                img = img.resize((size, size), Image.Resampling.BILINEAR)
            array = np.asarray(img, dtype=np.uint8)
    except UnidentifiedImageError:
        raise DataError("the upload is not an image Pillow can read (PNG, JPEG, GIF, BMP, ...)") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"the image is corrupt or truncated ({type(e).__name__})") from None
    t = torch.from_numpy(array.copy())
    return t.unsqueeze(0) if t.dim() == 2 else t.permute(2, 0, 1)  # (C, H, W)


class ViTAdapter(ExplorerAdapter):
    """Image classifier: top 5 classes, [CLS] -> patch attention per layer/head, and rollout."""

    def __init__(self, run_dir: Path) -> None:
        from attnlab.models.registry import from_pretrained
        from attnlab.training.tasks.images import load_labels

        self.model = from_pretrained(run_dir)
        self.model.eval()
        self.labels = load_labels(run_dir)
        c = self.model.config
        self.info = ModelInfo(
            family="vit", supported=True, run_name=run_dir.name, n_layer=c.n_layer, n_head=c.n_head,
            block_size=0, max_tokens=0, max_chars=0, vocab_size=None, input="image",
            image_size=c.image_size, in_channels=c.in_channels, max_upload_bytes=MAX_UPLOAD_BYTES,
        )

    def image_maps(self, data: bytes, resize: bool = False) -> dict[str, Any]:
        """{pixels (H, W[, 3]) the model saw, grid, top5, layers: [layer][head] (gh, gw), rollout (gh, gw)}."""
        from attnlab.data.images import normalize
        from attnlab.inspect.rollout import attention_rollout
        from attnlab.inspect.saliency import _query_row

        c = self.model.config
        image = decode_image(data, c.in_channels, c.image_size, resize)  # (C, S, S) uint8
        x = normalize(image[None], self.labels["mean"], self.labels["std"])  # (1, C, S, S)
        gh, gw = self.model.patch_emb.grid(x)
        layer_index, maps, out = record_self_attention(self.model, images=x)
        per_head = _query_row(torch.stack(maps), c.pooling).reshape(len(maps), c.n_head, gh, gw)  # (L, H, gh, gw)
        rollout = _query_row(attention_rollout([m[None] for m in maps])[0], c.pooling).reshape(gh, gw)
        classes = self.labels["classes"]
        pixels = image[0] if c.in_channels == 1 else image.permute(1, 2, 0)
        return {
            "pixels": pixels.tolist(),
            "grid": [gh, gw],
            "layer_index": layer_index,
            "top5": top_k(out.logits[0].float().softmax(-1), 5, lambda i: str(classes[i])),
            "layers": rounded(per_head),
            "rollout": rounded(rollout),
        }


ADAPTERS: dict[str, type[ExplorerAdapter]] = {"gpt": GPTAdapter, "bert": BertAdapter, "vit": ViTAdapter}


def load_adapter(run_dir: str | Path) -> ExplorerAdapter:
    """The adapter for the run folder's family (an UnsupportedAdapter for families not wired yet)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"run folder not found: {run_dir}")
    family = read_family(run_dir)
    if family not in ADAPTERS:
        return UnsupportedAdapter(run_dir, family)
    return ADAPTERS[family](run_dir)
