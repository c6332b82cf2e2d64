#!/usr/bin/env bash
# Start, stop or check the local Redis online store (redis-server from Debian) on $HOST:$REDIS_PORT.
#   infra/redis.sh start|stop|status
# start waits for a real PING; stop only stops a redis-server this script started.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
DIR="$SERVICES_DIR/redis"

healthy() { [ "$(redis-cli -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = "PONG" ]; }

start() {
  command -v redis-server >/dev/null || die "redis-server is not installed: run 'make setup' (it installs Debian's redis-server)"
  if owned_pid redis >/dev/null; then log "redis: already running (ours) on $HOST:$REDIS_PORT"; return 0; fi
  if port_open "$REDIS_PORT"; then
    healthy || die "port $REDIS_PORT is taken by something that is not Redis; set HEADWATER_REDIS_PORT"
    log "redis: a Redis not started by headwater answers on $HOST:$REDIS_PORT; using it, it will not be stopped"
    return 0
  fi
  mkdir -p "$DIR"
  # Append-only file with fsync every second: the online store survives a restart; no RDB snapshots,
  # which would fork a 2-core machine under write load. In the foreground under launch (not
  # --daemonize), so the pid recorded is the server's own from the start.
  launch redis redis-server --bind "$HOST" --port "$REDIS_PORT" --dir "$DIR" --daemonize no \
    --save "" --appendonly yes --appendfsync everysec --protected-mode yes
  wait_for redis 10 healthy
  log "redis: up on $HOST:$REDIS_PORT (state in $DIR)"
}

case "${1:-}" in
  start) start ;;
  stop) stop_owned redis ;;
  status) if healthy; then echo "redis: up on $HOST:$REDIS_PORT"; else echo "redis: down"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
