#!/usr/bin/env bash
# A long-running Kafka broker for manual development: scripts/kafka.sh start|stop|status
#
# Same broker as the tests (tokenpools_dev.devstack.kafka: one source for server.properties and JVM
# flags), but on a fixed port and with data kept between runs in .run/ (git-ignored):
#
#   TOKENPOOLS_KAFKA_PORT   broker port, default 19092 (the controller listens on port + 1)
#   TOKENPOOLS_KAFKA_DIR    work dir (server.properties, data/, broker.log), default .run/kafka-<port>
#   PYTHON                  interpreter with tokenpools-dev installed, default .venv/bin/python
#
# Then: TOKENPOOLS_TEST_KAFKA=127.0.0.1:19092 makes the integration tests use it instead of their own.
# Needs scripts/install-kafka.sh once. `rm -rf` the work dir (broker stopped) for a clean slate.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PORT=${TOKENPOOLS_KAFKA_PORT:-19092}
WORKDIR=${TOKENPOOLS_KAFKA_DIR:-$ROOT/.run/kafka-$PORT}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}

case "${1:-}" in
    start | stop | status) ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
[[ -x "$PYTHON" ]] || { echo "kafka.sh: no $PYTHON (make install, or set PYTHON)" >&2; exit 1; }
exec "$PYTHON" -m tokenpools_dev.devstack.kafka "$1" --port "$PORT" --workdir "$WORKDIR"
