"""The short Python path: ``attnlab.load(run)`` gives a model with its tokenizer, and the two things most
people want from it.

    >>> lm = attnlab.load("runs/shakespeare-char-20261124-101500")
    >>> lm.generate("ROMEO:", max_new_tokens=100, temperature=0.8, top_p=0.95, stop=["\\n\\n"])
    >>> patterns = lm.attention("To be, or not to be")   # one (heads, T, T) tensor per layer

``generate`` takes the options ``transformers``' ``generate`` users expect (temperature, top_k, top_p,
min_p, repetition_penalty, num_beams, stop strings, seed); a prompt longer than the model's context
keeps its last ``block_size`` tokens, with a one-line notice on stderr.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.core.errors import ConfigError


@dataclass
class Loaded:
    """A model and its tokenizer, as ``load`` returns them."""

    model: torch.nn.Module
    tokenizer: object
    path: Path

    def _ids(self, text: str) -> torch.Tensor:
        if not isinstance(text, str):  # a list would be encoded item by item, as if each were one character
            raise ConfigError(f"expected the text as a str, got {type(text).__name__}")
        ids = self.tokenizer.encode(text)
        if not ids:
            raise ConfigError("the text is empty once tokenized: give at least one token")
        return torch.tensor([ids])

    def generate(self, prompt: str, max_new_tokens: int = 200, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, min_p: float | None = None, repetition_penalty: float = 1.0,
                 num_beams: int = 1, stop: list[str] | None = None, seed: int | None = None) -> str:
        """The prompt followed by the generated text; it ends after the first stop string, if one appears."""
        from attnlab.generation import SamplingConfig, generate, stream
        from attnlab.models.size import check_fits

        if getattr(self.model.config, "family", None) != "gpt":
            raise ConfigError(f"generate needs a gpt model; {self.path} holds a {self.model.config.family}")
        cfg = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                             min_p=min_p, repetition_penalty=repetition_penalty, num_beams=num_beams, seed=seed)
        cfg.validate()
        check_stops(stop)
        check_fits(self.model.config, "the model", num_beams, inference=True, advice="use fewer beams")
        idx = self._ids(prompt)
        block = self.model.config.block_size
        if idx.size(1) > block:
            print(f"note: the prompt has {idx.size(1)} tokens and the model's context is {block}; "
                  f"generating from its last {block}", file=sys.stderr)
            idx = idx[:, -block:]
        if num_beams > 1:
            text = self.tokenizer.decode(generate(self.model, idx, cfg)[0].tolist()[idx.size(1):])
            return prompt + cut_at_stop(text, stop)
        new: list[int] = []
        for token in stream(self.model, idx, cfg):
            new.append(int(token[0, 0]))
            text = self.tokenizer.decode(new)
            if stop and any(s in text for s in stop):
                return prompt + cut_at_stop(text, stop)
        return prompt + self.tokenizer.decode(new)

    @torch.no_grad()
    def attention(self, text: str) -> list[torch.Tensor]:
        """The attention probabilities of every layer for ``text``: a list of (heads, T, T) tensors."""
        from attnlab.nn.hooks import capture

        idx = self._ids(text)[:, -self.model.config.block_size:]
        with capture(self.model, "*hook_pattern") as seen:
            self.model(idx)
        return [p[0] for p in seen.values()]


def check_stops(stop: list[str] | None) -> None:
    """A stop string must be a non-empty str (the empty string is in every text: nothing would be generated)."""
    for s in stop or []:
        if not isinstance(s, str) or not s:
            raise ConfigError(f"a stop string must be non-empty text, got {s!r}")


def cut_at_stop(text: str, stop: list[str] | None) -> str:
    """``text`` up to and including the earliest stop string (as transformers' stop_strings keep it)."""
    ends = [text.index(s) + len(s) for s in stop or [] if s in text]
    return text[:min(ends)] if ends else text


def load(path: str | Path, fold_ln: bool = False, center_writing_weights: bool = False,
         center_unembed: bool = False, fold_value_biases: bool = False) -> Loaded:
    """The model (in eval mode) and tokenizer of a run or model folder, checked against its manifest.

    The four options process a pre-norm GPT's weights for reading, as TransformerLens does on load
    (``attnlab.inspect.fold``); each leaves the predictions as they were:

        fold_ln                  W (n(x) gamma + beta) + b = (W diag gamma) n(x) + (W beta + b): each norm's
                                 gain and bias move into the layer that reads it (the LM head is untied and
                                 gains the bias W_U beta_f)
        center_writing_weights   every vector written into the stream (W_E, W_pos, W_O, W_2, their biases) loses
                                 its mean over C, which the next LayerNorm would remove anyway
        center_unembed           W_U <- W_U - mean over the vocabulary: all logits of a position shift alike
        fold_value_biases        b_O <- b_O + W_O b_V, b_V <- 0 (each row of probabilities sums to 1)

    A processed model is for looking at; train and save the original.
    """
    from attnlab.inspect.fold import check_processable, process_weights
    from attnlab.training.runs import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(path)
    if fold_ln or center_writing_weights or center_unembed or fold_value_biases:
        check_processable(model, centring=center_writing_weights)
        process_weights(model, fold_ln, center_writing_weights, center_unembed, fold_value_biases)
    return Loaded(model.eval(), tokenizer, Path(path))
