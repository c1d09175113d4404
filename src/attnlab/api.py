"""The short Python path: ``attnlab.load(folder)`` gives a model with its tokenizer, and what people want from
it, in the shape Hugging Face's users know.

    >>> lm = attnlab.load("runs/latest")                      # a run, an attnlab model folder or an HF folder
    >>> lm.generate("ROMEO:", max_new_tokens=100, temperature=0.8, top_p=0.95, stop=["\\n\\n"])
    >>> lm.generate(["To be", "O Romeo"], max_new_tokens=20, temperature=0)   # one left-padded batch
    >>> patterns = lm.attention("To be, or not to be")       # one (heads, T, T) tensor per layer
    >>> logits, cache = lm.run_with_cache("To be")           # (1, T, V) and {hook point: tensor}

A BERT answers ``embed(texts)`` (sentence embeddings), ``fill_mask(text)`` (the top guesses at each [MASK])
and, trained as a classifier or regressor, ``predict(inputs)``; a ViT or CNN classifier answers ``predict``
on image files. ``attnlab.pipeline(task, folder)`` (``attnlab.pipelines``) wraps these as transformers'
pipelines. Every text reaches the model as ``tokenizers.specials.encode_for`` writes it: a BERT's between
[CLS] and [SEP], as it was trained.

``generate`` takes the options ``transformers``' ``generate`` users expect (temperature, top_k, top_p,
min_p, repetition_penalty, num_beams, stop strings, seed); a prompt longer than the model's context
keeps its last ``block_size`` tokens, with a one-line notice on stderr. A list of prompts is one batch,
padded on the left (``attnlab.api_generate``): each row is what the prompt gives alone.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from attnlab.core.errors import CheckpointError, ConfigError


@dataclass
class Loaded:
    """A model and its tokenizer (None for an image model), as ``load`` returns them; ``extras`` holds what a
    Hugging Face folder brought in memory (its sentence settings, its image labels)."""

    model: torch.nn.Module
    tokenizer: object
    path: Path
    extras: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ what the folder says

    @cached_property
    def task(self) -> str:
        """What the model was trained for: its run's task (config.yaml), else read off the model (lm, mlm,
        classify, regress, image-classification, seq2seq)."""
        from attnlab.training.runs import RUN_CONFIG, load_run_config
        from attnlab.training.tasks import task_name

        if (self.path / RUN_CONFIG).is_file():
            cfg = load_run_config(self.path)
            return task_name(cfg.task, cfg.model.family)
        c = self.model.config
        if c.family == "bert":
            return "classify" if c.n_classes else "regress" if c.n_targets else "mlm"
        return {"gpt": "lm", "vit": "image-classification", "cnn": "image-classification"}.get(c.family, c.family)

    def labels(self) -> dict[str, Any]:
        """An image classifier's classes and normalisation ({"classes", "mean", "std"})."""
        from attnlab.training.tasks.images import load_labels

        return self.extras["labels"] if "labels" in self.extras else load_labels(self.path)

    def sentence_settings(self):
        """How a sentence becomes one vector (``inspect.encoders.SentenceSettings``): the folder's own, if any."""
        from attnlab.inspect.encoders import SentenceSettings

        return self.extras["sentence"] if "sentence" in self.extras else SentenceSettings.load(self.path)

    def ids(self, text: str) -> torch.Tensor:
        """(1, T) the ids the model reads for ``text`` (``tokenizers.specials.encode_for``: a BERT's between [CLS]
        and [SEP]); a GPT's longer than its context keep their last block_size ids."""
        from attnlab.tokenizers.specials import encode_for, n_specials

        if not isinstance(text, str):  # a list would be encoded item by item, as if each were one character
            raise ConfigError(f"expected the text as a str, got {type(text).__name__}")
        if self.tokenizer is None:
            raise ConfigError(f"{self.path} holds a {self.model.config.family} model: it reads images, not text")
        ids = encode_for(self.model, self.tokenizer, text)
        if len(ids) <= n_specials(self.model, self.tokenizer):
            raise ConfigError("the text is empty once tokenized: give at least one token")
        block = self.model.config.block_size
        if len(ids) > block and self.model.config.family != "gpt":
            raise ConfigError(f"the text is {len(ids)} tokens long, more than the model's context of {block}")
        return torch.tensor([ids[-block:]])

    # ------------------------------------------------------------------ generation

    def generate(self, prompt: str | list[str], max_new_tokens: int = 200, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                 repetition_penalty: float = 1.0, num_beams: int = 1, stop: list[str] | None = None,
                 seed: int | None = None) -> str | list[str]:
        """The prompt followed by the generated text; it ends after the first stop string, if one appears.
        A list of prompts gives a list of texts, generated as one left-padded batch."""
        from attnlab.api_generate import batches_exactly, generate_rows
        from attnlab.api_tasks import need_family, texts_of
        from attnlab.generation import SamplingConfig
        from attnlab.models.size import check_fits

        need_family(self, ("gpt",), "generate")
        cfg = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                             min_p=min_p, repetition_penalty=repetition_penalty, num_beams=num_beams, seed=seed)
        cfg.validate()
        check_stops(stop)
        if not isinstance(prompt, str | list | tuple):
            raise ConfigError(f"expected the text as a str or a list of str, got {type(prompt).__name__}")
        prompts = texts_of(prompt, "prompts")
        advice = "use fewer beams" if len(prompts) == 1 else "give fewer prompts at a time, or fewer beams"
        check_fits(self.model.config, "the model", num_beams * len(prompts), inference=True, advice=advice)
        rows = [self._prompt_ids(p) for p in prompts]  # every prompt checked before any is generated
        if len(rows) > 1 and num_beams == 1 and batches_exactly(self.model):
            decode = self.tokenizer.decode
            new = generate_rows(self.model, rows, cfg, lambda b, ids: bool(stop) and any(s in decode(ids) for s in
                                                                                         stop))
        else:
            new = [self._solo(r, cfg, stop) for r in rows]
        texts = [p + cut_at_stop(self.tokenizer.decode(n), stop) for p, n in zip(prompts, new, strict=True)]
        return texts[0] if isinstance(prompt, str) else texts

    def _prompt_ids(self, prompt: str) -> list[int]:
        """A prompt's ids, its last block_size if it is longer than the context (with a notice on stderr)."""
        ids = self.tokenizer.encode(prompt)
        if not ids:
            raise ConfigError("the text is empty once tokenized: give at least one token")
        block = self.model.config.block_size
        if len(ids) > block:
            print(f"note: the prompt has {len(ids)} tokens and the model's context is {block}; "
                  f"generating from its last {block}", file=sys.stderr)
        return ids[-block:]

    def _solo(self, ids: list[int], cfg, stop: list[str] | None) -> list[int]:
        """The new ids of one prompt: beam search, or token by token until a stop string appears."""
        from attnlab.generation import generate, stream

        idx = torch.tensor([ids])
        if cfg.num_beams > 1:
            return generate(self.model, idx, cfg)[0].tolist()[len(ids):]
        new: list[int] = []
        for token in stream(self.model, idx, cfg):
            new.append(int(token[0, 0]))
            if stop and any(s in self.tokenizer.decode(new) for s in stop):
                break
        return new

    # ------------------------------------------------------------------ looking inside

    @torch.no_grad()
    def attention(self, text: str) -> list[torch.Tensor]:
        """The attention probabilities of every layer for ``text``: a list of (heads, T, T) tensors (a BERT's T
        counts its [CLS] and [SEP])."""
        from attnlab.api_tasks import need_family
        from attnlab.nn.hooks import capture

        need_family(self, ("gpt", "bert"), "attention")
        idx = self.ids(text)
        with capture(self.model, "*hook_pattern") as seen:
            self.model(idx)
        return [p[0] for p in seen.values()]

    def run_with_cache(self, text: str, points: str | list[str] | None = None
                       ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(logits (1, T, V), {hook point name: tensor}) for ``text``, as TransformerLens's ``run_with_cache``;
        ``points``: fnmatch patterns of the points to keep (default: every point the layers compute anyway)."""
        from attnlab.api_tasks import run_with_cache

        return run_with_cache(self, text, points)

    # ------------------------------------------------------------------ encoders and classifiers

    def embed(self, texts: str | list[str], pooling: str | None = None, normalize: bool | None = None,
              max_len: int | None = None) -> torch.Tensor:
        """Sentence embeddings of a BERT: (C,) for a str, (N, C) for a list. ``pooling`` (mean, cls_token, cls),
        ``normalize`` and ``max_len`` default to the model's sentence settings (``attnlab embed``'s)."""
        from attnlab.api_tasks import embed, texts_of

        out = embed(self, texts_of(texts), pooling, normalize, max_len)
        return out[0] if isinstance(texts, str) else out

    def fill_mask(self, text: str | list[str], top_k: int = 5) -> list:
        """A masked LM's top_k guesses at each [MASK] of ``text``: one list of {"score", "token", "token_str",
        "sequence"} per [MASK], most likely first (a list of texts gives a list of those)."""
        from attnlab.api_tasks import fill_mask, texts_of

        out = [fill_mask(self, t, top_k) for t in texts_of(text)]
        return out[0] if isinstance(text, str) else out

    def predict(self, inputs, batch_size: int = 64, resize: bool = False) -> dict[str, Any] | list[dict[str, Any]]:
        """What the run was trained to answer, one row per input as ``attnlab predict`` writes them: a
        classifier's class and its probability, a regressor's values, an LM's next token, an MLM's filled-in
        text. Texts for text runs (a str gives one row), image files or a folder for image runs."""
        from attnlab.api_tasks import predict

        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        rows = predict(self, inputs, batch_size, resize)
        text_task = self.task not in ("image-classification", "continuous", "caption")
        return rows[0] if isinstance(inputs, str) and text_task else rows


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
    """The model (in eval mode) and tokenizer of a run or model folder, checked against its manifest, or of a
    Hugging Face folder (``attnlab export`` writes one), read in memory by attnlab's importer (``api_hf``).

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
    from attnlab.api_hf import is_hf_folder, load_hf_folder
    from attnlab.inspect.fold import check_processable, process_weights
    from attnlab.models.registry import from_pretrained
    from attnlab.tokenizers import load_tokenizer
    from attnlab.training.runs import resolve_run_dir

    path = resolve_run_dir(path)
    if not path.is_dir():
        raise CheckpointError(f"run folder not found: {path}")
    extras: dict[str, Any] = {}
    if is_hf_folder(path):
        imported = load_hf_folder(path)
        model, tokenizer, extras = imported.model, imported.tokenizer, imported.extras
    else:
        model = from_pretrained(path)
        has_tokenizer = (path / "tokenizer.json").is_file() or (path / "vocab.txt").is_file()
        tokenizer = load_tokenizer(path) if has_tokenizer or model.config.family in ("gpt", "bert") else None
    if fold_ln or center_writing_weights or center_unembed or fold_value_biases:
        check_processable(model, centring=center_writing_weights)
        process_weights(model, fold_ln, center_writing_weights, center_unembed, fold_value_biases)
    return Loaded(model.eval(), tokenizer, path, extras)
