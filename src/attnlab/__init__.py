"""attnlab: a laboratory for transformers — build them, train them, run them, look inside them.

Importing the package is cheap: submodules (torch models, trainer, plots) load on first use.
"""

from attnlab.core.version import __version__  # noqa: F401  (attnlab.__version__)


def load(path, **options):
    """``attnlab.load(run)``: the model and tokenizer of a run folder (or a model or Hugging Face folder), with
    ``generate``, ``attention``, ``run_with_cache``, ``embed``, ``fill_mask`` and ``predict``; ``options`` as
    ``attnlab.api.load`` takes them (e.g. ``fold_ln=True``)."""
    from attnlab.api import load as _load

    return _load(path, **options)


def pipeline(task, model, **defaults):
    """``attnlab.pipeline(task, folder)``: a transformers-style pipeline (text-generation, fill-mask,
    feature-extraction, text-classification, image-classification, regression) answering in transformers'
    shapes; see ``attnlab.pipelines``."""
    from attnlab.pipelines import pipeline as _pipeline

    return _pipeline(task, model, **defaults)
