#!/usr/bin/env bash
# Start, stop or check a local Redis Cluster for the online store: 3 primaries and 3 replicas
# (redis-server --cluster-enabled, from Debian) on $HOST, ports $REDIS_CLUSTER_PORT .. +5.
#   infra/redis-cluster.sh start|stop|status
# start waits until CLUSTER INFO says cluster_state:ok on every node; stop only stops the nodes
# this script started. The store, the tiers and the service use it through a
# `redis-cluster://HOST:PORT` URL (any node: the client discovers the others).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
BASE_PORT="${HEADWATER_REDIS_CLUSTER_PORT:-7000}"
NODES=6
# A primary that stops answering is failed over after this: short on loopback, where a node is
# either up or killed, so the failover tests and a user's restart do not wait long.
NODE_TIMEOUT_MS="${HEADWATER_REDIS_CLUSTER_NODE_TIMEOUT_MS:-2000}"

ports() { seq "$BASE_PORT" $((BASE_PORT + NODES - 1)); }
name_of() { echo "redis-cluster-$1"; }
cluster_ok() { [ "$(redis-cli -h "$HOST" -p "$1" cluster info 2>/dev/null | tr -d '\r' | grep -c '^cluster_state:ok$')" = 1 ]; }
pinging() { [ "$(redis-cli -h "$HOST" -p "$1" ping 2>/dev/null)" = "PONG" ]; }

start_node() {
  local port=$1 name dir
  name="$(name_of "$port")"
  dir="$SERVICES_DIR/$name"
  if owned_pid "$name" >/dev/null; then return 0; fi
  port_open "$port" && die "port $port is taken by something headwater did not start; set HEADWATER_REDIS_CLUSTER_PORT"
  mkdir -p "$dir"
  # Same durability as the single node (infra/redis.sh): AOF fsync every second, no RDB forks.
  launch "$name" redis-server --bind "$HOST" --port "$port" --dir "$dir" --daemonize no \
    --save "" --appendonly yes --appendfsync everysec --protected-mode yes \
    --cluster-enabled yes --cluster-config-file "$dir/nodes.conf" \
    --cluster-node-timeout "$NODE_TIMEOUT_MS" --maxmemory 512mb
  wait_for "$name" 10 pinging "$port"
}

start() {
  command -v redis-server >/dev/null || die "redis-server is not installed: run 'make setup'"
  local port
  for port in $(ports); do start_node "$port"; done
  if ! cluster_ok "$BASE_PORT"; then
    local known
    known=$(redis-cli -h "$HOST" -p "$BASE_PORT" cluster info | tr -d '\r' | sed -n 's/^cluster_known_nodes://p')
    if [ "${known:-1}" -lt "$NODES" ]; then  # a fresh cluster: assign the slots and the replicas
      # shellcheck disable=SC2046
      redis-cli --cluster create $(for p in $(ports); do printf '%s:%s ' "$HOST" "$p"; done) \
        --cluster-replicas 1 --cluster-yes > "$SERVICES_DIR/$(name_of "$BASE_PORT")/create.log"
    fi
  fi
  for _ in $(seq 1 150); do
    local all=1
    for port in $(ports); do cluster_ok "$port" || all=0; done
    [ "$all" = 1 ] && { log "redis cluster: up on $HOST:$BASE_PORT..$((BASE_PORT + NODES - 1)) (3 primaries, 3 replicas)"; return 0; }
    sleep 0.2
  done
  die "redis cluster did not reach cluster_state:ok within 30 s; see $SERVICES_DIR/redis-cluster-*/redis-cluster-*.log"
}

stop() {
  local port
  for port in $(ports); do stop_owned "$(name_of "$port")"; done
}

status() {
  if cluster_ok "$BASE_PORT"; then echo "redis cluster: ok on $HOST:$BASE_PORT"; else echo "redis cluster: down"; exit 1; fi
}

wipe() {  # stop, then forget the cluster's state (slots, AOF): the next start creates a new one
  stop
  local port
  for port in $(ports); do rm -rf "${SERVICES_DIR:?}/$(name_of "$port")"; done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  wipe) wipe ;;
  *) echo "usage: $0 start|stop|status|wipe" >&2; exit 2 ;;
esac
