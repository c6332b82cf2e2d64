#!/usr/bin/env bash
# Start, stop or check the local Redis online store (redis-server from Debian) on $HOST:$REDIS_PORT.
#   infra/redis.sh start|stop|status
# start waits for a real PING; stop only stops a redis-server this script started.
# Secured mode: HEADWATER_SECURE_DIR=DIR (where `bash infra/certs.sh DIR` wrote ca.pem, server.pem/.key
# and password) serves TLS only (tls-port, port 0) with one ACL user, headwater, whose password is
# DIR/password; the default user is off. Clients: rediss://headwater:PASSWORD@HOST:PORT/0?ssl_ca_certs=DIR/ca.pem.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
DIR="$SERVICES_DIR/redis"

SECURE="${HEADWATER_SECURE_DIR:-}"
REDIS_USER=headwater

# The health check goes over the secured link when there is one (the password through REDISCLI_AUTH,
# not on a command line that ps shows).
healthy() {
  if [ -n "$SECURE" ]; then
    [ "$(REDISCLI_AUTH="$(cat "$SECURE/password")" redis-cli --tls --cacert "$SECURE/ca.pem" \
         --user "$REDIS_USER" -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = "PONG" ]
  else
    [ "$(redis-cli -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = "PONG" ]
  fi
}

# secure_args: redis-server's TLS and ACL options for secured mode (the ACL file is written 0600).
secure_args() {
  (umask 077; printf 'user default off\nuser %s on >%s ~* &* +@all\n' "$REDIS_USER" "$(cat "$SECURE/password")" \
    > "$DIR/users.acl")
  printf '%s\n' --port 0 --tls-port "$REDIS_PORT" --tls-cert-file "$SECURE/server.pem" \
    --tls-key-file "$SECURE/server.key" --tls-ca-cert-file "$SECURE/ca.pem" --tls-auth-clients no \
    --aclfile "$DIR/users.acl"
}

start() {
  command -v redis-server >/dev/null || die "redis-server is not installed: run 'make setup' (it installs Debian's redis-server)"
  if owned_pid redis >/dev/null; then log "redis: already running (ours) on $HOST:$REDIS_PORT"; return 0; fi
  if port_open "$REDIS_PORT"; then
    healthy || die "port $REDIS_PORT is taken by something that is not Redis; set HEADWATER_REDIS_PORT"
    log "redis: a Redis not started by headwater answers on $HOST:$REDIS_PORT; using it, it will not be stopped"
    return 0
  fi
  mkdir -p "$DIR"
  local listen=(--port "$REDIS_PORT")
  if [ -n "$SECURE" ]; then
    for f in ca.pem server.pem server.key password; do
      [ -s "$SECURE/$f" ] || die "HEADWATER_SECURE_DIR=$SECURE has no $f: run 'bash infra/certs.sh $SECURE' first"
    done
    mapfile -t listen < <(secure_args)
  fi
  # Append-only file with fsync every second: the online store survives a restart; no RDB snapshots,
  # which would fork a 2-core machine under write load. In the foreground under launch (not
  # --daemonize), so the pid recorded is the server's own from the start.
  launch redis redis-server --bind "$HOST" "${listen[@]}" --dir "$DIR" --daemonize no \
    --save "" --appendonly yes --appendfsync everysec --protected-mode yes
  wait_for redis 10 healthy
  log "redis: up on $HOST:$REDIS_PORT${SECURE:+ (TLS, ACL user $REDIS_USER)} (state in $DIR)"
}

case "${1:-}" in
  start) start ;;
  stop) stop_owned redis ;;
  status) if healthy; then echo "redis: up on $HOST:$REDIS_PORT"; else echo "redis: down"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
