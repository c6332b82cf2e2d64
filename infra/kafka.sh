#!/usr/bin/env bash
# Start, stop or check a single-node KRaft Kafka broker on $HOST:$KAFKA_PORT.
#   infra/kafka.sh start|stop|status
# The broker runs from the jars resolved into infra/lib/kafka by `make setup` (no download here).
# start formats the storage once, launches the broker, then waits for a real produce + consume;
# stop only stops a broker this script started.
# Secured mode: HEADWATER_SECURE_DIR=DIR (where `bash infra/certs.sh DIR` wrote ca.pem, server.p12,
# truststore.p12 and password) puts a SASL_SSL listener (SCRAM-SHA-512) on $KAFKA_PORT; the user
# headwater (password DIR/password) is created at format time. The clients' settings are written to
# $SERVICES_DIR/kafka/client/headwater.yaml (kafka.security; no secret in it, only DIR/password's path).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
DIR="$SERVICES_DIR/kafka"
JARS="$INFRA_DIR/lib/kafka"
PARTITIONS="${HEADWATER_PARTITIONS:-4}"

SECURE="${HEADWATER_SECURE_DIR:-}"
KAFKA_USER=headwater
CLIENT_CONFIG="$DIR/client/headwater.yaml"

# The health check is a real produce + consume, over the SASL_SSL link in secured mode.
healthy() {
  if [ -n "$SECURE" ]; then
    HEADWATER_REPO="$CLIENT_CONFIG" "$PYTHON" -m headwater.cli.topics health --timeout "${1:-5}" >/dev/null 2>&1
  else
    "$PYTHON" -m headwater.cli.topics health --timeout "${1:-5}" >/dev/null 2>&1
  fi
}

# write_secure_config: the broker's SASL_SSL listener and the clients' headwater.yaml (secured mode).
write_secure_config() {
  local f pw
  for f in ca.pem server.p12 truststore.p12 password; do
    [ -s "$SECURE/$f" ] || die "HEADWATER_SECURE_DIR=$SECURE has no $f: run 'bash infra/certs.sh $SECURE' first"
  done
  pw="$(cat "$SECURE/password")"
  chmod 600 "$DIR/server.properties"
  sed -i -e "s#PLAINTEXT://#SASL_SSL://#g" -e "s#^inter.broker.listener.name=.*#inter.broker.listener.name=SASL_SSL#" \
      -e "s#^listener.security.protocol.map=.*#listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT#" \
      "$DIR/server.properties"
  cat >> "$DIR/server.properties" <<EOF
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$KAFKA_USER" password="$pw";
ssl.keystore.type=PKCS12
ssl.keystore.location=$SECURE/server.p12
ssl.keystore.password=$pw
ssl.truststore.type=PKCS12
ssl.truststore.location=$SECURE/truststore.p12
ssl.truststore.password=$pw
ssl.client.auth=none
EOF
  mkdir -p "$DIR/client"
  cat > "$CLIENT_CONFIG" <<EOF
# Written by infra/kafka.sh (secured mode): how a client reaches this broker. No secret here.
kafka:
  bootstrap: $HOST:$KAFKA_PORT
  security:
    protocol: SASL_SSL
    ca_file: $SECURE/ca.pem
    sasl:
      mechanism: SCRAM-SHA-512
      username: $KAFKA_USER
      password_file: $SECURE/password
EOF
}

write_config() {
  sed -e "s#@HOST@#$HOST#g" -e "s#@PORT@#$KAFKA_PORT#g" -e "s#@CONTROLLER_PORT@#$KAFKA_CONTROLLER_PORT#g" \
      -e "s#@DATA@#$DIR/data#g" -e "s#@PARTITIONS@#$PARTITIONS#g" \
      "$INFRA_DIR/config/kafka-server.properties" > "$DIR/server.properties"
  cp "$INFRA_DIR/config/kafka-log4j2.yaml" "$DIR/log4j2.yaml"
}

start() {
  [ -d "$JARS" ] && ls "$JARS"/kafka_2.13-*.jar >/dev/null 2>&1 \
    || die "Kafka jars missing in $JARS: run 'make setup' (resolves them with Maven from infra/pom.xml)"
  if owned_pid kafka >/dev/null; then log "kafka: already running (ours) on $HOST:$KAFKA_PORT"; return 0; fi
  if port_open "$KAFKA_PORT"; then
    healthy 10 || die "port $KAFKA_PORT is taken by something that is not a working Kafka; set HEADWATER_KAFKA_PORT"
    log "kafka: a broker not started by headwater answers on $HOST:$KAFKA_PORT; using it, it will not be stopped"
    return 0
  fi
  port_open "$KAFKA_CONTROLLER_PORT" && die "controller port $KAFKA_CONTROLLER_PORT is taken; set HEADWATER_KAFKA_CONTROLLER_PORT"
  mkdir -p "$DIR/data"
  write_config
  local scram=()
  if [ -n "$SECURE" ]; then
    write_secure_config
    scram=(--add-scram "SCRAM-SHA-512=[name=$KAFKA_USER,password=$(cat "$SECURE/password")]")
  fi
  local java_opts=(-Xms256m -Xmx1g -XX:+UseG1GC -Djava.awt.headless=true
                   "-Dlog4j2.configurationFile=$DIR/log4j2.yaml" "-Dkafka.logs.dir=$DIR")
  if [ ! -f "$DIR/data/meta.properties" ]; then
    log "kafka: formatting storage in $DIR/data"
    java "${java_opts[@]}" -cp "$JARS/*" kafka.tools.StorageTool format --standalone \
      -t "$(cat /proc/sys/kernel/random/uuid | tr -d '-' | head -c 22)" -c "$DIR/server.properties" "${scram[@]}" \
      > "$DIR/format.log" 2>&1 || die "kafka storage format failed; see $DIR/format.log"
  fi
  launch kafka java "${java_opts[@]}" -cp "$JARS/*" kafka.Kafka "$DIR/server.properties"
  log "kafka: starting (pid $(cat "$DIR/kafka.pid")), waiting for a produce/consume round trip"
  wait_for kafka 90 healthy 5
  log "kafka: up on $HOST:$KAFKA_PORT${SECURE:+ (SASL_SSL, SCRAM user $KAFKA_USER; clients: $CLIENT_CONFIG)} (state in $DIR)"
}

case "${1:-}" in
  start) start ;;
  stop) stop_owned kafka ;;
  status) if healthy 5; then echo "kafka: up on $HOST:$KAFKA_PORT"; else echo "kafka: down"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
