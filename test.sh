#!/usr/bin/env bash
# Quick start, part 2: set up .venv (with test tools), lint, check the import floors, and run the test
# suite on all cores.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh dev 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/ruff check --no-cache src tests benchmarks scripts
.venv/bin/lint-imports --no-cache  # the floors of DESIGN.md (pyproject.toml: [tool.importlinter])
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-auto}" --dist worksteal -q -p no:cacheprovider "$@"
