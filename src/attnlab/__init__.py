"""attnlab: a laboratory for transformers — build them, train them, run them, look inside them.

Importing the package is cheap: submodules (torch models, trainer, plots) load on first use.
"""

from attnlab.core.version import __version__  # noqa: F401  (attnlab.__version__)


def load(path, **options):
    """``attnlab.load(run)``: the model and tokenizer of a run folder, with ``generate`` and ``attention``;
    ``options`` as ``attnlab.api.load`` takes them (e.g. ``fold_ln=True``)."""
    from attnlab.api import load as _load

    return _load(path, **options)
