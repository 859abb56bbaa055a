#!/usr/bin/env bash
# Lint, format check and type check, as `make lint` (and so `make test`) runs them.
# Exits non-zero at the first tool that finds something. VENV names the virtualenv (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${VENV:-.venv}/bin"
PATHS=(src tests scripts)

echo "ruff check"
"$BIN/ruff" check "${PATHS[@]}"
echo "ruff format --check"
"$BIN/ruff" format --check "${PATHS[@]}"
echo "mypy (config: [tool.mypy] in pyproject.toml)"
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$BIN/mypy"
