#!/usr/bin/env bash
# Install every real service the tests use (idempotent; cached in $TOKENPOOLS_CACHE, default ~/.cache/tokenpools).
set -euo pipefail
cd "$(dirname "$0")"
start=$(date +%s)
for step in install-kafka.sh install-inference-sim.sh install-prometheus.sh install-etcd.sh install-kube-apiserver.sh install-kustomize.sh install-operator-crds.sh install-vllm.sh; do
  t0=$(date +%s)
  bash "./$step"
  echo "install-services: $step done in $(( $(date +%s) - t0 )) s"
done
echo "install-services: all services installed in $(( $(date +%s) - start )) s"
