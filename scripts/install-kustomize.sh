#!/usr/bin/env bash
# Build the real `kustomize` (sigs.k8s.io/kustomize/kustomize/v5) from the Go module proxy, cached OUTSIDE the repo.
#
# Why kustomize and not kubectl: `kubectl apply -k` renders with the same kustomize API (kubectl embeds it), and
# kustomize is one small Go module that `go install` builds directly, while kubectl needs the kubernetes wrapper
# module and minutes more. The deploy dry-run test (tests/integration/test_deploy_dry_run.py) renders with it.
#
# Idempotent: a marker next to the binary makes a re-run return immediately. The Go module and build caches are
# shared with install-kube-apiserver.sh under the cache dir.
#
# Env:
#   TOKENPOOLS_CACHE   cache root (default: $HOME/.cache/tokenpools)
#   KUSTOMIZE_VERSION  kustomize version without the "v" (default below)
# Prints the binary path as the last line of stdout.
set -euo pipefail

VERSION="${KUSTOMIZE_VERSION:-5.8.0}"
CACHE="${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}"
OUT_DIR="$CACHE/kustomize/v$VERSION"
BIN="$OUT_DIR/kustomize"
MARKER="$OUT_DIR/.built-ok"

log() { echo "[install-kustomize] $*" >&2; }
is_built() { [ -x "$BIN" ] && [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "v$VERSION" ]; }

if is_built; then log "cached: $BIN"; echo "$BIN"; exit 0; fi
command -v go >/dev/null || { log "go not found on PATH"; exit 1; }

mkdir -p "$OUT_DIR"
# Serialise concurrent runs (two CI jobs on one machine must not build twice into the same dir).
exec 9>"$OUT_DIR/.lock"
flock 9
if is_built; then log "cached (built by a concurrent run): $BIN"; echo "$BIN"; exit 0; fi

export GOMODCACHE="${GOMODCACHE_OVERRIDE:-$CACHE/go/mod}"
export GOCACHE="${GOCACHE_OVERRIDE:-$CACHE/go/build}"
export GOFLAGS="-modcacherw -buildvcs=false"
export CGO_ENABLED=0
# Stay on the machine's Go: never let a go directive trigger a toolchain download.
export GOTOOLCHAIN=local
export GOBIN="$OUT_DIR/gobin"

start=$(date +%s)
log "building kustomize v$VERSION with $(go version | awk '{print $3}')"
go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kustomize/kustomize/v5@v$VERSION"
mv "$GOBIN/kustomize" "$BIN"
rmdir "$GOBIN"
"$BIN" version >&2

elapsed=$(( $(date +%s) - start ))
echo "$elapsed" > "$OUT_DIR/build-seconds"
echo "v$VERSION" > "$MARKER"
log "built $BIN in ${elapsed}s"
echo "$BIN"
