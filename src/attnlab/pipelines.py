"""``attnlab.pipeline(task, model)``: transformers' pipelines over attnlab's models, answering in their shapes.

    task                   model                       one input gives                           a list gives
    text-generation        gpt                         [{"generated_text": prompt + new}]        [[{...}], ...]
    fill-mask              bert (MLM)                  [{"score", "token", "token_str",          one of those
                                                       "sequence"}] (a list of those per [MASK]   per text
                                                       when the text has several)
    feature-extraction     bert                        [[[C floats] per token]] ([CLS], [SEP]    one per text
                                                       included: (1, T, C) as nested lists)
    text-classification    bert classifier (classify)  [{"label", "score"}] (top_k, default 1)  one dict per
                                                                                                 text (top_k=1)
    image-classification   vit or cnn classifier       [{"label", "score"}] (top_k, default 5)  one list per
                                                                                                 image
    regression             bert regressor (regress)    [{"value": v}] (one per target)           one per text

``model`` is a folder (a run, ``runs/latest``, an attnlab model folder or a Hugging Face folder) or what
``attnlab.load`` returned. A task the model cannot do is one line (ConfigError) when the pipeline is made.
Keyword arguments given when the pipeline is made are defaults for every call (e.g. ``max_new_tokens``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.api import Loaded, load
from attnlab.core.errors import ConfigError

#: task -> (the model families it takes, the run tasks it takes: None for any)
TASKS: dict[str, tuple[tuple[str, ...], tuple[str, ...] | None]] = {
    "text-generation": (("gpt",), None),
    "fill-mask": (("bert",), ("mlm",)),
    "feature-extraction": (("bert",), None),
    "text-classification": (("bert",), ("classify",)),
    "image-classification": (("vit", "cnn"), ("image-classification",)),
    "regression": (("bert",), ("regress",)),
}


class Pipeline:
    """A loaded model bound to one task; call it on one input or a list of them."""

    def __init__(self, task: str, loaded: Loaded, defaults: dict[str, Any]) -> None:
        self.task, self.loaded, self.defaults = task, loaded, defaults

    @property
    def model(self):
        """The attnlab model the pipeline runs."""
        return self.loaded.model

    @property
    def tokenizer(self):
        """Its tokenizer (None for an image model)."""
        return self.loaded.tokenizer

    def __call__(self, inputs, **options):
        options = {**self.defaults, **options}
        many = isinstance(inputs, list | tuple)
        if self.task == "text-generation":
            texts = self.loaded.generate(list(inputs) if many else inputs, **options)
            return [[{"generated_text": t}] for t in texts] if many else [{"generated_text": texts}]
        if self.task == "fill-mask":
            per_text = self.loaded.fill_mask(list(inputs) if many else [inputs], **options)
            shaped = [masks[0] if len(masks) == 1 else masks for masks in per_text]
            return shaped if many else shaped[0]
        if self.task == "feature-extraction":
            from attnlab.api_tasks import hidden_states, texts_of

            _no_options(self.task, options)
            states = [[h] for h in hidden_states(self.loaded, texts_of(inputs))]  # (1, T, C) each
            return states if many else states[0]
        if self.task == "regression":
            from attnlab.api_tasks import regress

            _, values = regress(self.loaded, list(inputs) if many else inputs, **options)
            rows = [[{"value": float(v)} for v in row] for row in values.tolist()]
            return rows if many else rows[0]
        return self._classify(inputs, many, options)

    def _classify(self, inputs, many: bool, options: dict[str, Any]):
        """text-classification ([{"label", "score"}] per text, the top one unless top_k) and
        image-classification (per image its top_k classes, default 5)."""
        from attnlab.api_tasks import classify, top_classes

        image = self.task == "image-classification"
        top_k = options.pop("top_k", 5 if image else 1)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ConfigError(f"top_k must be an integer >= 1, got {top_k!r}")
        _, probs, classes = classify(self.loaded, list(inputs) if many else inputs, **options)
        rows = top_classes(probs, classes, top_k)
        if image:
            return rows if many or len(rows) > 1 else rows[0]  # a folder is several images
        if top_k == 1:
            return [r[0] for r in rows]  # transformers: one dict per text
        return rows if many else rows[0]

    def __repr__(self) -> str:
        return f"Pipeline(task={self.task!r}, model={str(self.loaded.path)!r})"


def _no_options(task: str, options: dict[str, Any]) -> None:
    if options:
        raise ConfigError(f"{task} takes no options; got {', '.join(sorted(options))}")


def pipeline(task: str, model: str | Path | Loaded, **defaults) -> Pipeline:
    """A pipeline for ``task`` (see the module's table) on ``model`` (a folder or a ``Loaded``); ``defaults``
    are passed to every call. ConfigError (one line) for an unknown task or a model that cannot do it."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    loaded = model if isinstance(model, Loaded) else load(model)
    families, run_tasks = TASKS[task]
    family = loaded.model.config.family
    if family not in families:
        raise ConfigError(f"{task} needs a {' or '.join(families)} model; {loaded.path} holds a {family}")
    if run_tasks is not None and loaded.task not in run_tasks:
        raise ConfigError(f"{task} needs a model trained for {' or '.join(run_tasks)}; {loaded.path} was "
                          f"trained for {loaded.task}")
    return Pipeline(task, loaded, dict(defaults))
