#!/usr/bin/env bash
# Bring the local platform services up or down: Redis, then Kafka, then the platform topics.
#   infra/services.sh up|down|status
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

case "${1:-}" in
  up)
    "$INFRA_DIR/redis.sh" start
    "$INFRA_DIR/kafka.sh" start
    "$PYTHON" -m headwater.cli.topics create
    ;;
  down)
    "$INFRA_DIR/kafka.sh" stop
    "$INFRA_DIR/redis.sh" stop
    ;;
  status)
    rc=0
    "$INFRA_DIR/redis.sh" status || rc=1
    "$INFRA_DIR/kafka.sh" status || rc=1
    exit $rc
    ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
