#!/usr/bin/env bash
# Install llm-d-inference-sim (the vLLM stand-in for integration tests) into the tokenpools cache,
# outside the repo:  ${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}/bin/llm-d-inference-sim
#
# Idempotent: exits at once when the binary of the pinned version is already installed.
# v0.8.0+ is pure Go (go-zeromq, no libzmq/Rust tokenizers), so CGO_ENABLED=0 gives a static binary
# with only the Go module proxy reachable. Cold: ~1 min of downloads + several minutes of compiling
# on 2 cores (k8s client-go, grpc, a wasm/transpiled sqlite).
#
# Why not plain `go install github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim@v0.10.2`:
# `go install pkg@version` always checks the module for deprecation, which needs the proxy's
# `@v/list`/`@latest`; the CI proxy serves only concrete versions (list -> 403 "This module version
# is not available") and Go treats that as fatal. So we pin the same version in a throw-away
# wrapper module and `go install` the package from there -- same MVS build list, same binary.
#
# Prints the absolute path of the binary on stdout (last line); logs go to stderr.
set -euo pipefail

SIM_MODULE="github.com/llm-d/llm-d-inference-sim"
SIM_PKG="$SIM_MODULE/cmd/llm-d-inference-sim"   # main package in v0.10.2 (cmd/llm-d-inference-sim/main.go)
SIM_VERSION="${INFERENCE_SIM_VERSION:-v0.10.2}"

CACHE="${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}"
BIN_DIR="$CACHE/bin"
BIN="$BIN_DIR/llm-d-inference-sim"
STAMP="$BIN.version"

log() { printf 'install-inference-sim: %s\n' "$*" >&2; }
installed() { [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$SIM_VERSION" ]]; }

if installed; then
    log "up to date ($SIM_VERSION)"
    echo "$BIN"
    exit 0
fi

command -v go >/dev/null 2>&1 || { log "ERROR: 'go' not on PATH (need Go >= 1.25.7)"; exit 1; }

mkdir -p "$BIN_DIR"
# Serialise concurrent installs (parallel CI jobs sharing one cache).
exec 9>"$BIN_DIR/.install-inference-sim.lock"
command -v flock >/dev/null 2>&1 && flock 9
if installed; then
    log "up to date ($SIM_VERSION, installed by a concurrent run)"
    echo "$BIN"
    exit 0
fi

# Go caches live in the tokenpools cache too (one dir for CI to persist; -modcacherw so rm -rf works).
export GOMODCACHE="${GOMODCACHE_OVERRIDE:-$CACHE/go/mod}"
export GOCACHE="${GOCACHE_OVERRIDE:-$CACHE/go/build}"
export GOFLAGS="-modcacherw -buildvcs=false -trimpath"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off   # needs a local Go >= 1.25.7 (v0.10.2 go.mod)

WRAP="$CACHE/build/inference-sim-$SIM_VERSION"
TMP_BIN="$(mktemp -d "$BIN_DIR/.gobin.XXXXXX")"   # a half-written binary is never visible at $BIN
trap 'rm -rf "$TMP_BIN"' EXIT

start=$SECONDS
log "building $SIM_PKG@$SIM_VERSION with $(go version) in $WRAP (cold: several minutes)"
rm -rf "$WRAP" && mkdir -p "$WRAP"
(
    cd "$WRAP"
    go mod init tokenpools.local/inference-sim-build >/dev/null 2>&1
    go get "$SIM_PKG@$SIM_VERSION"
    GOBIN="$TMP_BIN" go install "$SIM_PKG"
)
mv -f "$TMP_BIN/llm-d-inference-sim" "$BIN"
echo "$SIM_VERSION" >"$STAMP"
log "installed $BIN ($("$BIN" --help 2>&1 | grep -c -- '--') flags) in $((SECONDS - start))s"
echo "$BIN"
