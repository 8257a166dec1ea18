#!/usr/bin/env bash
# Provide an etcd binary for the loopback kube-apiserver used by the integration tests.
#
# Default: Debian's etcd-server (3.4.23 on bookworm), installed with apt-get only if `etcd` is missing.
# ETCD_FROM_SOURCE=1 (or a Debian etcd older than ETCD_MIN_VERSION) builds etcd from the Go module proxy
# instead, cached OUTSIDE the repo. go.etcd.io/etcd/server/v3 has replace directives in its go.mod, so
# `go install ...@v3.6.x` is refused; a five-line wrapper module calling etcdmain.Main is built instead.
#
# Env:
#   TOKENPOOLS_CACHE   cache root (default: $HOME/.cache/tokenpools)
#   ETCD_FROM_SOURCE   1 = always use the Go-built etcd
#   ETCD_MIN_VERSION   minimum acceptable system etcd (default 3.4.0: kube-apiserver 1.34 accepts 3.4.23)
#   ETCD_GO_VERSION    etcd version to build from source (default below)
# Prints the etcd binary path as the last line of stdout and records it in $CACHE/etcd/selected,
# which tokenpools_dev.devstack.kube reads, so the tests use exactly the etcd this script chose.
set -euo pipefail

CACHE="${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}"
ETCD_GO_VERSION="${ETCD_GO_VERSION:-3.6.16}"
ETCD_MIN_VERSION="${ETCD_MIN_VERSION:-3.4.0}"

log() { echo "[install-etcd] $*" >&2; }
select_etcd() { mkdir -p "$CACHE/etcd"; echo "$1" > "$CACHE/etcd/selected"; echo "$1"; }

version_of() { "$1" --version 2>/dev/null | awk '/^etcd Version:/{print $3}'; }
# True when $1 >= $2 (dotted versions).
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

build_from_source() {
  local out="$CACHE/etcd/v$ETCD_GO_VERSION" bin marker
  bin="$out/etcd"; marker="$out/.built-ok"
  if [ -x "$bin" ] && [ "$(cat "$marker" 2>/dev/null)" = "v$ETCD_GO_VERSION" ]; then
    log "cached: $bin"; select_etcd "$bin"; return 0
  fi
  command -v go >/dev/null || { log "go not found on PATH"; return 1; }
  mkdir -p "$out"
  exec 9>"$out/.lock"; flock 9
  export GOMODCACHE="${GOMODCACHE_OVERRIDE:-$CACHE/go/mod}" GOCACHE="${GOCACHE_OVERRIDE:-$CACHE/go/build}"
  export GOFLAGS="-modcacherw -buildvcs=false" CGO_ENABLED=0 GOTOOLCHAIN=local
  local work="$out/build" start; start=$(date +%s)
  rm -rf "$work"; mkdir -p "$work"; cd "$work"
  go mod init local/etcd-build >/dev/null 2>&1
  cat > main.go <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  if ! { go get "go.etcd.io/etcd/server/v3@v$ETCD_GO_VERSION" && go mod tidy; } >"$out/go-get.log" 2>&1; then
    tail -n 40 "$out/go-get.log" >&2; return 1
  fi
  go build -trimpath -ldflags "-s -w" -o "$bin.tmp" .
  mv "$bin.tmp" "$bin"
  echo "v$ETCD_GO_VERSION" > "$marker"
  log "built $bin in $(( $(date +%s) - start ))s"
  select_etcd "$bin"
}

if [ "${ETCD_FROM_SOURCE:-0}" = "1" ]; then
  build_from_source; exit 0
fi

if ! command -v etcd >/dev/null; then
  log "etcd missing: apt-get install etcd-server etcd-client"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q etcd-server etcd-client >&2 || { apt-get update -q >&2 && apt-get install -y -q etcd-server etcd-client >&2; }
fi

sys_etcd="$(command -v etcd)"
sys_ver="$(version_of "$sys_etcd")"
if [ -n "$sys_ver" ] && version_ge "$sys_ver" "$ETCD_MIN_VERSION"; then
  log "using system etcd $sys_ver: $sys_etcd"
  select_etcd "$sys_etcd"
else
  log "system etcd '${sys_ver:-unknown}' < $ETCD_MIN_VERSION: building v$ETCD_GO_VERSION from the Go proxy"
  build_from_source
fi
