#!/usr/bin/env bash
# Install the Prometheus server (and promtool) from Debian for integration tests.
#
# Idempotent: exits at once when `prometheus` and `promtool` are already on PATH. promtool (same package) checks
# the scrape config the tests write and runs the alert rules' unit tests (tests/unit/test_prometheus_rules.py),
# so a machine with a prometheus binary from elsewhere but no promtool still installs the package. Debian bookworm ships
# 2.42.0+ds; its postinst only adds a systemd unit, and the tests start the server by hand
# (tokenpools_dev.devstack.prometheus), so nothing here is left running.
# `apt-get update` runs only if the install fails without it (fresh images often already
# have package lists, and update is the slow, flaky part).
set -euo pipefail

log() { printf 'install-prometheus: %s\n' "$*" >&2; }

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    log "already installed: $(prometheus --version 2>&1 | head -n1), with promtool"
    exit 0
fi

SUDO=()
if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { log "ERROR: need root or sudo to apt-get install prometheus"; exit 1; }
    SUDO=(sudo -n)
fi
export DEBIAN_FRONTEND=noninteractive
APT_INSTALL=("${SUDO[@]}" apt-get install -y --no-install-recommends prometheus)

start=$SECONDS
if ! "${APT_INSTALL[@]}"; then
    log "install failed; running apt-get update and retrying"
    "${SUDO[@]}" apt-get update
    "${APT_INSTALL[@]}"
fi
command -v promtool >/dev/null 2>&1 || { log "ERROR: the prometheus package did not put promtool on PATH"; exit 1; }
log "installed in $((SECONDS - start))s: $(prometheus --version 2>&1 | head -n1), with promtool"
