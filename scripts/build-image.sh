#!/usr/bin/env bash
# Build the container image tokenpools:<version> without a Docker engine or a registry: a Debian bookworm root file
# system from debootstrap (cached), the project's wheel and its dependencies installed into a venv inside it with the
# rootfs's own python3 (bookworm ships 3.11), a non-root user (uid 10001), committed into the local containers
# storage with buildah (where podman sees it). Runs as root (debootstrap, chroot, buildah mount).
#
#   scripts/build-image.sh                              # -> localhost/tokenpools:<version> in local storage
#   scripts/build-image.sh --docker-archive out/img.tar # also a docker-archive named tokenpools:<version>
#                                                       # (kind load image-archive, docker/podman load, ctr import)
#   scripts/build-image.sh --oci-archive out/img.oci.tar
#
# Caches (under $TOKENPOOLS_CACHE/image, default ~/.cache/tokenpools/image): the debootstrap rootfs (keyed by suite
# and package list) and the dependency wheels (keyed by pyproject.toml's dependency list). A warm rebuild only
# rebuilds the project's wheel and the image layer: ~1 min on 2 idle cores, ~3 under load; cold ~10 min.
# PYTHON (default python3, with pip) builds the wheels; it must be CPython 3.11 on x86_64/glibc like the image,
# which a bookworm host is (the script checks).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
CACHE="${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}/image"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
UID_GID=10001
# python3-venv brings ensurepip (the venv's pip installs the wheels offline); ca-certificates for TLS to Kafka,
# backends and the Kubernetes API. No init: every long-running command handles SIGTERM itself (as PID 1 too).
PACKAGES=python3,python3-venv,ca-certificates
DOCKER_ARCHIVE=""
OCI_ARCHIVE=""

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --docker-archive) DOCKER_ARCHIVE="$(realpath -m "$2")"; shift 2 ;;
    --oci-archive) OCI_ARCHIVE="$(realpath -m "$2")"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "build-image: unknown argument $1" >&2; usage 2 ;;
  esac
done

log() { printf '[build-image %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
[ "$(id -u)" = 0 ] || { echo "build-image: run as root (debootstrap, chroot and buildah mount need it)" >&2; exit 1; }

VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO/pyproject.toml" | head -1)"
[ -n "$VERSION" ] || { echo "build-image: no version in $REPO/pyproject.toml" >&2; exit 1; }
IMAGE="localhost/tokenpools:$VERSION"

# --- the tools, from Debian (no Docker engine: buildah builds, podman runs) ---------------------------------------
# runc: on a host with hybrid cgroups (v1 controllers) Debian's default runtime, crun, cannot start containers
missing=()
for tool in debootstrap buildah podman runc; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
same_python='import sys, platform; assert sys.version_info[:2] == (3, 11) and platform.machine() == "x86_64"'
"$PYTHON" -c "$same_python" \
  || { echo "build-image: PYTHON=$PYTHON must be CPython 3.11 on x86_64 (the image's python)" >&2; exit 1; }
"$PYTHON" -m pip --version >/dev/null \
  || { echo "build-image: $PYTHON has no pip (set PYTHON to a venv's python)" >&2; exit 1; }

mkdir -p "$CACHE"
WORK="$(mktemp -d "$CACHE/work.XXXXXX")"
CTR=""
cleanup() {
  if [ -n "$CTR" ]; then buildah umount "$CTR" >/dev/null 2>&1 || true; buildah rm "$CTR" >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# --- 1. the base rootfs: debootstrap minbase + python3, the user; cached ------------------------------------------
key="$(printf '%s %s %s %s' "$SUITE" "$PACKAGES" "$UID_GID" 1 | sha256sum | cut -c1-12)"
ROOTFS="$CACHE/rootfs-$SUITE-$key"
if [ ! -f "$ROOTFS/.complete" ]; then
  log "debootstrap $SUITE (minbase + $PACKAGES) from $MIRROR (cold: a few minutes)"
  rm -rf "$ROOTFS" "$ROOTFS.tmp"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS.tmp" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
  chroot "$ROOTFS.tmp" groupadd --gid "$UID_GID" tokenpools
  chroot "$ROOTFS.tmp" useradd --uid "$UID_GID" --gid "$UID_GID" --home-dir /home/tokenpools --create-home \
    --shell /usr/sbin/nologin tokenpools
  # the writable paths the manifests mount (emptyDir) exist, owned by the user, so a bare `podman run` works too
  install -d -o "$UID_GID" -g "$UID_GID" "$ROOTFS.tmp/var/spool/tokenpools" "$ROOTFS.tmp/var/lib/tokenpools"
  install -d "$ROOTFS.tmp/etc/tokenpools"
  # an image needs no package manager state, docs or caches
  rm -rf "$ROOTFS.tmp"/var/lib/apt/lists/* "$ROOTFS.tmp"/var/cache/apt/* "$ROOTFS.tmp"/var/log/* \
    "$ROOTFS.tmp"/usr/share/doc/* "$ROOTFS.tmp"/usr/share/man/* "$ROOTFS.tmp"/usr/share/info/*
  touch "$ROOTFS.tmp/.complete"
  mv "$ROOTFS.tmp" "$ROOTFS"
else
  log "rootfs cached: $ROOTFS"
fi

# --- 2. the wheels: the project's (always rebuilt, from the checkout's files) and its dependencies' (cached) ------
SRC="$WORK/src"
mkdir -p "$SRC"
if git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
  # tracked and untracked-but-not-ignored files only: no .venv, build/, egg-info or compiled accelerator in the wheel
  (cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
     | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$SRC"
else
  cp -a "$REPO/." "$SRC/"
fi
log "building the tokenpools $VERSION wheel"
"$PYTHON" -m pip wheel -q --no-deps --wheel-dir "$WORK/wheels" "$SRC"
# keyed by the project's dependency list only: a pytest marker or a version bump keeps the cache
deps_key="$(sed -n '/^dependencies = \[/,/^\]/p' "$REPO/pyproject.toml" | sha256sum | cut -c1-12)"
DEPS="$CACHE/wheels-$deps_key"
if [ ! -f "$DEPS/.complete" ]; then
  log "downloading/building the dependency wheels"
  rm -rf "$CACHE"/wheels-*  # the wheels of an older dependency list
  "$PYTHON" -m pip wheel -q --wheel-dir "$DEPS" "$WORK/wheels"/tokenpools-*.whl
  rm -f "$DEPS"/tokenpools-*.whl
  touch "$DEPS/.complete"
else
  log "dependency wheels cached: $DEPS"
fi

# --- 3. the image: rootfs + venv, from scratch ---------------------------------------------------------------------
log "assembling $IMAGE"
CTR="$(buildah from scratch)"
MNT="$(buildah mount "$CTR")"
cp -a "$ROOTFS/." "$MNT/"
rm -f "$MNT/.complete"
mkdir -p "$MNT/tmp/wheels"
cp "$WORK/wheels"/*.whl "$DEPS"/*.whl "$MNT/tmp/wheels/"
# the rootfs's own python3 makes the venv and installs offline (--no-index): the image's interpreter, not the host's
# a clean environment: the host's PIP_*/PYTHON* variables do not apply inside the image
in_rootfs() { chroot "$MNT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
mount -t proc proc "$MNT/proc"
mount --rbind /dev "$MNT/dev"
install_rc=0
{
  in_rootfs /usr/bin/python3 -m venv /opt/tokenpools \
    && in_rootfs /opt/tokenpools/bin/pip install -q --no-index --no-cache-dir --find-links /tmp/wheels tokenpools \
    && in_rootfs /opt/tokenpools/bin/pip uninstall -q -y pip
} || install_rc=$?
umount "$MNT/proc"
umount -R "$MNT/dev"
[ "$install_rc" = 0 ] || { echo "build-image: installing into the venv failed ($install_rc)" >&2; exit "$install_rc"; }
rm -rf "$MNT/tmp/wheels" "$MNT/root/.cache"
in_rootfs /opt/tokenpools/bin/tokenpools --version >/dev/null  # the entry point resolves, as root, before commit

buildah config \
  --user "$UID_GID:$UID_GID" \
  --workingdir /home/tokenpools \
  --env PATH=/opt/tokenpools/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env HOME=/home/tokenpools \
  --env PYTHONDONTWRITEBYTECODE=1 \
  --env PYTHONUNBUFFERED=1 \
  --env MPLCONFIGDIR=/tmp/matplotlib \
  --entrypoint '["tokenpools"]' \
  --cmd '["--help"]' \
  --port 8080 \
  --label org.opencontainers.image.title=tokenpools \
  --label org.opencontainers.image.version="$VERSION" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  "$CTR"
buildah umount "$CTR" >/dev/null
buildah commit -q --rm "$CTR" "$IMAGE" >/dev/null
CTR=""
log "built $IMAGE ($(buildah images --format '{{.Size}}' "$IMAGE"))"

# --- 4. optional archives, named tokenpools:<version> as the manifests refer to it -----------------------------------
if [ -n "$DOCKER_ARCHIVE" ]; then
  mkdir -p "$(dirname "$DOCKER_ARCHIVE")"; rm -f "$DOCKER_ARCHIVE"
  buildah push -q "$IMAGE" "docker-archive:$DOCKER_ARCHIVE:docker.io/library/tokenpools:$VERSION"
  log "wrote $DOCKER_ARCHIVE (docker-archive, docker.io/library/tokenpools:$VERSION)"
fi
if [ -n "$OCI_ARCHIVE" ]; then
  mkdir -p "$(dirname "$OCI_ARCHIVE")"; rm -f "$OCI_ARCHIVE"
  buildah push -q "$IMAGE" "oci-archive:$OCI_ARCHIVE:tokenpools:$VERSION"
  log "wrote $OCI_ARCHIVE (oci-archive, tokenpools:$VERSION)"
fi
echo "$IMAGE"
