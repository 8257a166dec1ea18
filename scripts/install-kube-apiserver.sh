#!/usr/bin/env bash
# Build a real kube-apiserver from the Go module k8s.io/kubernetes, cached OUTSIDE the repo.
#
# Why a wrapper module: k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/apiserver, ...)
# at the non-existent version v0.0.0, so `go install k8s.io/kubernetes/cmd/kube-apiserver@vX` is refused.
# A throw-away main module that `replace`s every such k8s.io/* module with the matching v0.<minor>.<patch>
# lets `go build` resolve everything from the Go module proxy (kubernetes#79384, golang/go#32776).
#
# Idempotent: a marker next to the binary makes a re-run return immediately. The Go module and build
# caches live under the cache dir too, so a rebuild after deleting only the binary is incremental.
#
# Env:
#   TOKENPOOLS_CACHE       cache root (default: $HOME/.cache/tokenpools)
#   KUBE_APISERVER_VERSION Kubernetes version without the "v" (default below; builds with Go 1.26.x)
#   KUBE_BUILD_JOBS        go build -p value (default: nproc)
# Prints the binary path as the last line of stdout.
set -euo pipefail

K8S_VERSION="${KUBE_APISERVER_VERSION:-1.34.4}"
CACHE="${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}"
OUT_DIR="$CACHE/kube/v$K8S_VERSION"
BIN="$OUT_DIR/kube-apiserver"
MARKER="$OUT_DIR/.built-ok"
JOBS="${KUBE_BUILD_JOBS:-$(nproc)}"

log() { echo "[install-kube-apiserver] $*" >&2; }

is_built() { [ -x "$BIN" ] && [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "v$K8S_VERSION" ]; }

if is_built; then
  log "cached: $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "go not found on PATH (need Go >= 1.24)"; exit 1; }

mkdir -p "$OUT_DIR"
# Serialise concurrent runs (two CI jobs on one machine must not build twice into the same dir).
exec 9>"$OUT_DIR/.lock"
flock 9
if is_built; then log "cached (built by a concurrent run): $BIN"; echo "$BIN"; exit 0; fi

export GOMODCACHE="${GOMODCACHE_OVERRIDE:-$CACHE/go/mod}"
export GOCACHE="${GOCACHE_OVERRIDE:-$CACHE/go/build}"
# -modcacherw: keep the module cache deletable with plain rm -rf; -buildvcs=false: the wrapper has no VCS.
export GOFLAGS="-modcacherw -buildvcs=false"
export CGO_ENABLED=0
# Stay on the machine's Go: never let a go directive trigger a toolchain download.
export GOTOOLCHAIN=local

STG_VERSION="0.${K8S_VERSION#1.}"     # 1.34.4 -> 0.34.4
MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"
WORK="$OUT_DIR/build"
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"

start=$(date +%s)
log "building kube-apiserver v$K8S_VERSION with $(go version | awk '{print $3}') (-p $JOBS) in $WORK"

go mod init local/kube-apiserver-build >/dev/null 2>&1
GOMOD_FILE="$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("GoMod") or sys.exit("go mod download: " + d.get("Error", "?")))')"
replaced=0
for m in $(awk '$2=="v0.0.0"{print $1}' "$GOMOD_FILE" | grep '^k8s.io/'); do
  go mod edit -replace="$m=$m@v$STG_VERSION"
  replaced=$((replaced + 1))
done
log "replaced $replaced staging modules with v$STG_VERSION"
# `go get` lists ~200 "added" modules: keep them in a log, show it only on failure.
if ! go get "k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION" >"$OUT_DIR/go-get.log" 2>&1; then
  tail -n 40 "$OUT_DIR/go-get.log" >&2; exit 1
fi

go build -p "$JOBS" -trimpath -o "$BIN.tmp" \
  -ldflags "-s -w \
    -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION \
    -X k8s.io/component-base/version.gitMajor=1 \
    -X k8s.io/component-base/version.gitMinor=$MINOR \
    -X k8s.io/component-base/version.gitTreeState=clean \
    -X k8s.io/component-base/version.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  k8s.io/kubernetes/cmd/kube-apiserver
mv "$BIN.tmp" "$BIN"
"$BIN" --version >&2
cp go.mod "$OUT_DIR/go.mod.used"

elapsed=$(( $(date +%s) - start ))
echo "$elapsed" > "$OUT_DIR/build-seconds"
echo "v$K8S_VERSION" > "$MARKER"
log "built $BIN in ${elapsed}s"
echo "$BIN"
