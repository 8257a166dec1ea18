#!/usr/bin/env bash
# Create the project's virtualenv and install tokenpools with its dev extras, and the dev tooling beside it
# (tokenpools-dev from tools/: `tokenpools up`/`down`/`load`, `experiment --mode live`, test support). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "tokenpools needs Python >= 3.11"'
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip setuptools wheel
"$VENV/bin/python" -m pip install --quiet -e '.[dev]' -e tools
echo "bootstrap: $("$VENV/bin/python" --version) in $VENV with tokenpools and tokenpools-dev installed"
