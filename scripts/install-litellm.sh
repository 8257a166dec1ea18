#!/usr/bin/env bash
# Install the LiteLLM proxy (the peer that benchmarks/peers.py compares against) into its own venv in the
# tokenpools cache, outside the repo and away from the project's .venv (its pins would clash with ours):
#   ${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}/litellm-venv/bin/litellm
#
# Pinned: litellm[proxy]==1.95.0 and fastapi==0.136.3. Newer LiteLLM (1.110+) moved the proxy into a separate
# `litellm-proxy` package the package index here does not serve. The 1.95.0 served here asks for fastapi>=0.136.3
# (so `fastapi<0.120` cannot resolve) but its proxy imports fastapi's `get_flat_dependant`, which the newest fastapi
# (0.165) no longer has: pinned to its own lower bound, which imports and runs.
#
# Idempotent: exits at once when the pinned version is already installed. Prints the absolute path of the
# `litellm` executable on stdout (last line); logs go to stderr.
set -euo pipefail

LITELLM_VERSION="${LITELLM_VERSION:-1.95.0}"
FASTAPI_VERSION="${LITELLM_FASTAPI_VERSION:-0.136.3}"
CACHE="${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}"
VENV="$CACHE/litellm-venv"
BIN="$VENV/bin/litellm"
STAMP="$VENV/.litellm.version"
PYTHON="${PYTHON:-python3}"

log() { printf 'install-litellm: %s\n' "$*" >&2; }
installed() { [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$LITELLM_VERSION" ]]; }

if installed; then
    log "up to date ($LITELLM_VERSION)"
    echo "$BIN"
    exit 0
fi

mkdir -p "$CACHE"
# Serialise concurrent installs (parallel CI jobs sharing one cache).
exec 9>"$CACHE/.install-litellm.lock"
command -v flock >/dev/null 2>&1 && flock 9
if installed; then
    log "up to date ($LITELLM_VERSION, installed by a concurrent run)"
    echo "$BIN"
    exit 0
fi

start=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >&2
"$VENV/bin/pip" install -q "litellm[proxy]==$LITELLM_VERSION" "fastapi==$FASTAPI_VERSION" >&2
LITELLM_LOCAL_MODEL_COST_MAP=True "$VENV/bin/python" -c "import litellm.proxy.proxy_server" >&2   # fails here, not mid-benchmark, if it cannot import
echo "$LITELLM_VERSION" > "$STAMP"
log "installed $LITELLM_VERSION in $(( $(date +%s) - start )) s"
echo "$BIN"
