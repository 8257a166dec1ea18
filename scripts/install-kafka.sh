#!/usr/bin/env bash
# Install the runtime classpath of a single-node Apache Kafka 4.x broker (KRaft) from Maven Central.
#
# Kafka publishes no broker tarball on Maven Central, but its jars are there: `mvn
# dependency:copy-dependencies` on tools/kafka/pom.xml copies kafka_2.13 and everything it pulls in
# (plus slf4j-simple for logs) into a cache OUTSIDE the repo, so CI on the same machine reuses it and a
# fresh machine downloads it once (~45 MB):
#
#     ${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}/kafka-<version>/libs
#
# Idempotent: a `.complete` marker is written last, and a second run with the marker exits at once.
# tokenpools_dev.devstack.kafka.KafkaBroker refuses to start without the marker. Nothing is left running.
set -euo pipefail

log() { printf 'install-kafka: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
POM="$ROOT/tools/kafka/pom.xml"
VERSION=$(sed -n 's:.*<kafka\.version>\([^<]*\)</kafka\.version>.*:\1:p' "$POM")
[[ -n "$VERSION" ]] || die "no <kafka.version> in $POM"
DEST="${TOKENPOOLS_CACHE:-$HOME/.cache/tokenpools}/kafka-$VERSION"
MARKER="$DEST/.complete"

if [[ -f "$MARKER" ]]; then
    log "Kafka $VERSION already installed in $DEST/libs ($(ls "$DEST/libs" | wc -l) jars)"
    exit 0
fi

JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
command -v "$JAVA" >/dev/null 2>&1 \
    || die "java not found: Kafka $VERSION brokers need Java 17+ (apt-get install -y openjdk-17-jre-headless)"
JAVA_MAJOR=$("$JAVA" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java\.specification\.version = //p')
(( ${JAVA_MAJOR%%.*} >= 17 )) || die "$JAVA is Java $JAVA_MAJOR; Kafka $VERSION brokers need Java 17+ (set JAVA_HOME)"
command -v mvn >/dev/null 2>&1 || die "mvn not found (apt-get install -y maven)"

start=$SECONDS
mkdir -p "$DEST"
TMP=$(mktemp -d "$DEST/libs.tmp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
log "resolving org.apache.kafka:kafka_2.13:$VERSION from Maven Central (first run downloads ~45 MB)"
MVN_LOG="$DEST/mvn.log"
# Debian's Maven 3.8.7 prints stray ANSI resets even with -q: keep its output for failures only.
if ! mvn -B -q -f "$POM" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$TMP" \
        >"$MVN_LOG" 2>&1; then
    cat "$MVN_LOG" >&2
    die "mvn could not copy the Kafka $VERSION classpath from Maven Central (errors above, also in $MVN_LOG)"
fi
[[ -f "$TMP/kafka_2.13-$VERSION.jar" ]] || die "kafka_2.13-$VERSION.jar missing from the resolved classpath"

chmod 755 "$TMP"
rm -rf "$DEST/libs" "$DEST"/broker-*.jsa  # class-data archives of older jars are useless
mv "$TMP" "$DEST/libs"
{
    echo "kafka.version=$VERSION"
    echo "installed=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "java=$JAVA_MAJOR"
} > "$MARKER"
log "installed Kafka $VERSION in $((SECONDS - start)) s: $(ls "$DEST/libs" | wc -l) jars, $(du -sh "$DEST/libs" | cut -f1) in $DEST/libs"
