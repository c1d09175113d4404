"""What the explorer shows, per model family: attention maps and the model's own guesses.

One adapter per family, chosen from the run folder's ``config.json``:

* GPT: ``attention_maps(text)`` runs the model once with ``need_weights=True`` and returns, for each
  attention layer, the probabilities P = softmax(QK^T/sqrt(d_k) + mask) of every head, (H, T, T)
  as nested lists; ``next_token_top10`` is softmax(logits[T-1]) restricted to its 10 largest entries.
* other families (BERT's masked-token guesses, ViT's image input) are not wired to the explorer yet:
  their adapter answers every request with one clear line (HTTP 400), so the page still serves its
  toy and convolution tabs.

The recorder of ``attnlab.inspect`` can replace ``_forward_with_weights`` without touching the server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnlab.errors import AttnlabError, CheckpointError, ConfigError

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


class ExplorerAdapter:
    """The interface the server calls. Subclasses answer for one family."""

    info: ModelInfo

    def attention_maps(self, text: str) -> dict[str, Any]:
        raise ConfigError(self.info.message)

    def describe(self) -> dict[str, Any]:
        return dict(self.info.__dict__)


class UnsupportedAdapter(ExplorerAdapter):
    """A run whose family the explorer cannot show yet: every model request is a clear 400."""

    def __init__(self, run_dir: Path, family: str) -> None:
        self.info = ModelInfo(
            family=family, supported=False, run_name=run_dir.name, n_layer=0, n_head=0, block_size=0,
            max_tokens=0, max_chars=0, vocab_size=None,
            message=f"this run's family '{family}' is not supported by the explorer yet (only gpt); "
                    "the toy and convolution tabs still work",
        )


class GPTAdapter(ExplorerAdapter):
    """Causal LM: attention maps of every layer/head and the next-token distribution."""

    def __init__(self, run_dir: Path, max_tokens: int = MAX_EXPLORER_TOKENS) -> None:
        from attnlab.runs import load_model_and_tokenizer

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

    @torch.no_grad()
    def _forward_with_weights(self, ids: list[int]) -> tuple[list[int], list[torch.Tensor], torch.Tensor]:
        """One forward pass: (indices of the attention layers, their probs (H, T, T), logits (T, V))."""
        out = self.model(torch.tensor([ids]), need_weights=True)
        layers, maps = [], []
        for i, extras in enumerate(out.attentions or []):
            probs = extras.get("self") if extras else None
            if probs is not None:  # a state-space layer has no attention to show
                layers.append(i)
                maps.append(probs[0].float())  # (H, T, T)
        return layers, maps, out.logits[0].float()  # (T, V)

    def attention_maps(self, text: str) -> dict[str, Any]:
        """{tokens, layer_index, layers: [layer][head][query][key], next_token: top 10}."""
        ids = self.encode(text)
        layer_index, maps, logits = self._forward_with_weights(ids)
        return {
            "tokens": [self.tokenizer.decode([i]) for i in ids],
            "layer_index": layer_index,
            "layers": [m.round(decimals=DIGITS).tolist() for m in maps],
            "next_token": self.next_token_top10(logits[-1]),
        }

    def next_token_top10(self, logits: torch.Tensor) -> list[dict[str, Any]]:
        """softmax(logits) (V,) -> the 10 most likely next tokens, most likely first."""
        probs = torch.softmax(logits, dim=-1)  # (V,)
        top = torch.topk(probs, k=min(10, probs.numel()))
        return [{"token": self.tokenizer.decode([int(i)]), "id": int(i), "p": round(float(p), DIGITS)}
                for p, i in zip(top.values, top.indices)]


ADAPTERS: dict[str, type[ExplorerAdapter]] = {"gpt": GPTAdapter}


def load_adapter(run_dir: str | Path) -> ExplorerAdapter:
    """The adapter for the run folder's family (an UnsupportedAdapter for families not wired yet)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"run folder not found: {run_dir}")
    family = read_family(run_dir)
    if family not in ADAPTERS:
        return UnsupportedAdapter(run_dir, family)
    return ADAPTERS[family](run_dir)
