"""Optional dependencies: the base install trains, samples, evaluates, exports and imports; the explorer,
attributions, probes and some experiments need packages a user may not want (a web server, Captum,
scikit-learn with SciPy). Each is imported through ``require``, which names the extra to install in one
line instead of an ImportError traceback.

    extra          packages                     what needs them
    web            fastapi, uvicorn             attnlab explore
    inspect        captum, scikit-learn         attributions, linear probes, data=digits
    experiments    scipy, scikit-learn, sacrebleu, captum, ray   experiments' fits, BLEU, the study engine
    tensorboard    tensorboard                  logger=tensorboard
    mlflow         mlflow                       logger=mlflow (not in all: it brings a server and a database)
    audio          librosa, soundfile, espeakng-loader   WAV data, log-mel frames, spoken-word synthesis
    materials      pyxtal (with pymatgen)       XRD patterns of generated crystals
    all            every one of them but mlflow
"""

from __future__ import annotations

import importlib
from types import ModuleType

from attnlab.core.errors import AttnlabError

# import name -> (package to install, the extra that brings it)
EXTRAS: dict[str, tuple[str, str]] = {
    "fastapi": ("fastapi", "web"), "uvicorn": ("uvicorn", "web"), "captum": ("captum", "inspect"),
    "sklearn": ("scikit-learn", "inspect"), "scipy": ("scipy", "experiments"),
    "sacrebleu": ("sacrebleu", "experiments"), "ray": ("ray", "experiments"),
    "tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow"),
    "librosa": ("librosa", "audio"), "soundfile": ("soundfile", "audio"),
    "espeakng_loader": ("espeakng-loader", "audio"), "pyxtal": ("pyxtal", "materials"),
}

NOT_IN_ALL = frozenset({"mlflow"})  # extras that attnlab[all] leaves out (pyproject.toml)


class MissingExtraError(AttnlabError):
    """An optional dependency is not installed (one line naming the extra)."""


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (a top-level name in ``EXTRAS``), or raise MissingExtraError naming its extra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        package, extra = EXTRAS[module]
        also = "" if extra in NOT_IN_ALL else " (or attnlab[all])"
        raise MissingExtraError(f"{purpose} needs {package}, which is not installed: "
                                f"pip install 'attnlab[{extra}]'{also}") from None
