#!/usr/bin/env bash
# Check the import contracts (pyproject.toml [tool.importlinter]) on the package as it is installed.
#
# The top-level folders are mapped into tokenpools.* by pyproject's package-dir, so the checkout has no
# tokenpools/proxy/ folder for import-linter to walk; it lints a non-editable install of the package in a temporary
# directory instead: exactly the files a wheel ships, under the names they are imported by.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
ROOT=$PWD
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
"$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation --target "$SITE" . 2>/dev/null \
  || "$VENV/bin/python" -m pip install --no-deps --no-build-isolation --target "$SITE" .
cd "$SITE"
"$ROOT/$VENV/bin/lint-imports" --config "$ROOT/pyproject.toml"
