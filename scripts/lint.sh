#!/usr/bin/env bash
# Check the import contracts (pyproject.toml [tool.importlinter]) on the packages as they are installed, and that
# the product's installed files hold only the product.
#
# The top-level folders are mapped into tokenpools.* by pyproject's package-dir, so the checkout has no
# tokenpools/proxy/ folder for import-linter to walk; it lints a non-editable install in a temporary directory
# instead: exactly the files the wheels ship, under the names they are imported by. Both projects go there, the
# product (.) and the dev tooling (tools/: tokenpools_dev), so the contracts between them are checked too. They are
# built from a copy of the checkout's files (tracked or new, not ignored): setuptools' build/ keeps the files of
# earlier builds, modules since moved or deleted included, and would install them again.
#
# First, with the product installed alone: its files (its dist-info RECORD) must not include a dev module
# (tokenpools_dev, or a module or package named like the tooling: devstack, live, loadgen, testing, harness,
# benchtools), and its command line must offer only its own commands and `experiment --mode sim`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
ROOT=$PWD
PYTHON="$ROOT/$VENV/bin/python"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SRC=$TMP/src
SITE=$TMP/site

mkdir "$SRC"
# the checkout's files, tracked or new and not ignored, that exist (one deleted but not staged is still listed)
existing='import os, sys; sys.stdout.write("".join(f + "\0" for f in sys.stdin.read().split("\0") if os.path.isfile(f)))'
git ls-files -z --cached --others --exclude-standard | "$PYTHON" -c "$existing" | tar --null -T - -cf - | tar -xf - -C "$SRC"
install() {  # quietly, unless it fails: then again, with pip's output
  "$PYTHON" -m pip install --quiet --no-deps --no-build-isolation --target "$SITE" "$1" 2>/dev/null \
    || "$PYTHON" -m pip install --no-deps --no-build-isolation --target "$SITE" "$1"
}

install "$SRC"
"$PYTHON" - "$SITE" <<'PY'
import sys
from pathlib import Path, PurePosixPath

DEV_NAMES = {"tokenpools_dev", "devstack", "live", "loadgen", "testing", "harness", "benchtools"}
(record,) = Path(sys.argv[1]).glob("tokenpools-*.dist-info/RECORD")
files = [PurePosixPath(line.rsplit(",", 2)[0]) for line in record.read_text().splitlines() if line.strip()]
dev = sorted(str(f) for f in files
             if not f.parts[0].endswith(".dist-info") and DEV_NAMES & {*f.parts[:-1], f.name.split(".")[0]})
if dev:
    print("lint: the product's installed files include dev tooling (it belongs in tools/, package tokenpools_dev):",
          *dev, sep="\n  ", file=sys.stderr)
    raise SystemExit(1)
PY

# The product alone (-S: no site-packages, hence no tokenpools-dev and none of its entry points; -P: not the
# checkout's tokenpools/ folder either).
PYTHONPATH="$SITE" "$PYTHON" -S -P -m tokenpools --help >/dev/null
PYTHONPATH="$SITE" "$PYTHON" -S -P -m tokenpools experiment --help >/dev/null
PYTHONPATH="$SITE" "$PYTHON" -S -P - <<'PY'
import sys

from tokenpools.cli import COMMANDS, installed_commands
from tokenpools.replay.cli import experiment_modes

commands, modes = [c.name for c in installed_commands()], [m.name for m in experiment_modes()]
if commands != [c.name for c in COMMANDS] or modes != ["sim"]:
    print(f"lint: without tokenpools-dev the product offers the commands {commands} and the modes {modes}; "
          "the dev ones (up, down, load, --mode live) must come from tokenpools-dev only", file=sys.stderr)
    raise SystemExit(1)
PY

install "$SRC/tools"
cd "$SITE"
"$ROOT/$VENV/bin/lint-imports" --config "$ROOT/pyproject.toml"
