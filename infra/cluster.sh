#!/usr/bin/env bash
# The cluster profile (issue 19) on loopback: the engines' own clusters, small enough for one machine.
#   infra/cluster.sh up|down|status
# up starts, each health-checked before the next:
#   - Redis Cluster, 3 primaries + 3 replicas (infra/redis-cluster.sh, ports 7000-7005);
#   - a 3-node KRaft Kafka (broker+controller per JVM, -Xmx384m), brokers on $HEADWATER_KAFKA_CLUSTER_PORT
#     .. +2 (19092-19094), controllers on +100 (19192-19194); replication factor 3, min.insync.replicas 2;
#   - a Flink standalone session cluster from the apache-flink package's distribution: 1 JobManager
#     (REST on $HEADWATER_FLINK_REST_PORT, 8281) and 2 TaskManagers with 2 slots each;
#   - a Spark standalone master (spark://HOST:$HEADWATER_SPARK_MASTER_PORT, 7077) and one worker
#     (2 cores, 2g) from the pyspark package.
# State, generated configs and logs live under $HEADWATER_SERVICES_DIR/cluster (infra/state/cluster).
# down stops only the processes this script started (common.sh owned_pid/stop_owned), Redis Cluster
# included; the shared single-node Kafka (9092) and Redis (6379) are never touched.
# Single parts, for the failure tests: `infra/cluster.sh start|stop NAME` (NAME: flink-jm, flink-tm1,
# flink-tm2, spark-master, spark-worker, kafka-1, kafka-2, kafka-3).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
SERVICES_DIR="$SERVICES_DIR/cluster"
TEMPLATES="$INFRA_DIR/cluster"
SITE="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
FLINK_DIST="$SITE/pyflink"
SPARK_DIST="$SITE/pyspark"
KAFKA_JARS="$INFRA_DIR/lib/kafka"
KAFKA_BASE="${HEADWATER_KAFKA_CLUSTER_PORT:-19092}"
FLINK_REST="${HEADWATER_FLINK_REST_PORT:-8281}"
FLINK_RPC="${HEADWATER_FLINK_RPC_PORT:-6223}"
SPARK_PORT="${HEADWATER_SPARK_MASTER_PORT:-7077}"
SPARK_UI="${HEADWATER_SPARK_UI_PORT:-8380}"
PARTITIONS="${HEADWATER_PARTITIONS:-4}"
KAFKA_BOOTSTRAP="$HOST:$KAFKA_BASE,$HOST:$((KAFKA_BASE + 1)),$HOST:$((KAFKA_BASE + 2))"

# launch and wait_for live in common.sh (the one start-up wait of every infra script).

# ---------------------------------------------------------------- Kafka (3 KRaft nodes)
kafka_port() { echo $((KAFKA_BASE + $1 - 1)); }
kafka_healthy() {
  HEADWATER_KAFKA_BOOTSTRAP="$KAFKA_BOOTSTRAP" HEADWATER_KAFKA_REPLICATION=3 "$PYTHON" -m headwater.cli.topics health \
    --timeout "${1:-10}" >/dev/null 2>&1
}

start_kafka_node() {
  local n=$1 name="kafka-$1" dir="$SERVICES_DIR/kafka-$1" voters="" i
  if owned_pid "$name" >/dev/null; then return 0; fi
  port_open "$(kafka_port "$n")" && die "port $(kafka_port "$n") is taken; set HEADWATER_KAFKA_CLUSTER_PORT"
  mkdir -p "$dir/data"
  for i in 1 2 3; do voters="$voters${voters:+,}$i@$HOST:$(($(kafka_port "$i") + 100))"; done
  sed -e "s#@HOST@#$HOST#g" -e "s#@PORT@#$(kafka_port "$n")#g" -e "s#@CONTROLLER_PORT@#$(($(kafka_port "$n") + 100))#g" \
      -e "s#@NODE_ID@#$n#g" -e "s#@VOTERS@#$voters#g" -e "s#@DATA@#$dir/data#g" -e "s#@PARTITIONS@#$PARTITIONS#g" \
      "$TEMPLATES/kafka-node.properties" > "$dir/server.properties"
  cp "$INFRA_DIR/config/kafka-log4j2.yaml" "$dir/log4j2.yaml"
  local java_opts=(-Xms128m -Xmx384m -XX:+UseG1GC -Djava.awt.headless=true
                   "-Dlog4j2.configurationFile=$dir/log4j2.yaml" "-Dkafka.logs.dir=$dir")
  if [ ! -f "$dir/data/meta.properties" ]; then
    [ -f "$SERVICES_DIR/kafka.cluster-id" ] \
      || tr -d '-' < /proc/sys/kernel/random/uuid | head -c 22 > "$SERVICES_DIR/kafka.cluster-id"
    java "${java_opts[@]}" -cp "$KAFKA_JARS/*" kafka.tools.StorageTool format \
      -t "$(cat "$SERVICES_DIR/kafka.cluster-id")" -c "$dir/server.properties" > "$dir/format.log" 2>&1 \
      || die "kafka-$n storage format failed; see $dir/format.log"
  fi
  launch "$name" java "${java_opts[@]}" -cp "$KAFKA_JARS/*" kafka.Kafka "$dir/server.properties"
  log "$name: started (pid $(cat "$dir/$name.pid"), $HOST:$(kafka_port "$n"))"
}

kafka_up() {
  ls "$KAFKA_JARS"/kafka_2.13-*.jar >/dev/null 2>&1 || die "Kafka jars missing in $KAFKA_JARS: run 'make setup'"
  local n
  for n in 1 2 3; do start_kafka_node "$n"; done
  # A quorum of 3 controllers elects a leader only once 2 are up: start all, then check the round trip.
  wait_for kafka-1 90 kafka_healthy 5
  log "kafka: 3 brokers up on $KAFKA_BOOTSTRAP (RF 3, min.insync.replicas 2)"
}

# ---------------------------------------------------------------- Flink session cluster
flink_conf() {  # flink_conf NAME: write NAME's conf dir (config.yaml + log4j) and print its path
  local dir="$SERVICES_DIR/$1" opts
  mkdir -p "$dir/conf" "$dir/log" "$dir/lib"
  opts="$(sed -n 's/^ *all: //p' "$FLINK_DIST/conf/config.yaml" | head -1)"
  sed -e "s#@HOST@#$HOST#g" -e "s#@JM_RPC_PORT@#$FLINK_RPC#g" -e "s#@REST_PORT@#$FLINK_REST#g" \
      -e "s#@DIR@#$dir#g" -e "s#@NAME@#$1#g" -e "s#@JAVA_OPTS_ALL@#$opts#g" "$TEMPLATES/flink-config.yaml" > "$dir/conf/config.yaml"
  cp "$FLINK_DIST"/conf/log4j*.properties "$dir/conf/"
  # The distribution's lib/ plus flink-python from opt/ (Python UDFs run on the TaskManagers).
  ln -sfn "$FLINK_DIST"/lib/*.jar "$dir/lib/"
  ln -sfn "$FLINK_DIST"/opt/flink-python-*.jar "$dir/lib/"
}

start_flink() {  # start_flink NAME jobmanager|taskmanager (their start-foreground sizes the JVM)
  local name=$1 role=$2 dir="$SERVICES_DIR/$1"
  if owned_pid "$name" >/dev/null; then return 0; fi
  flink_conf "$name"
  FLINK_HOME="$FLINK_DIST" FLINK_CONF_DIR="$dir/conf" FLINK_LIB_DIR="$dir/lib" FLINK_LOG_DIR="$dir/log" \
    FLINK_PID_DIR="$dir" launch "$name" bash "$FLINK_DIST/bin/$role.sh" start-foreground
  log "$name: started (pid $(cat "$dir/$name.pid"))"
}

flink_overview() { curl -sf "http://$HOST:$FLINK_REST/overview" 2>/dev/null; }
flink_answers() { flink_overview >/dev/null; }
flink_tms() { flink_overview | sed -n 's/.*"taskmanagers":\([0-9]*\).*/\1/p'; }
flink_has_tms() { [ "$(flink_tms)" = "${1:-2}" ]; }

flink_up() {
  [ -f "$FLINK_DIST/bin/flink-console.sh" ] || die "no Flink distribution in $FLINK_DIST: run 'make setup'"
  port_open "$FLINK_REST" && ! owned_pid flink-jm >/dev/null && die "port $FLINK_REST is taken; set HEADWATER_FLINK_REST_PORT"
  start_flink flink-jm jobmanager
  wait_for flink-jm 90 flink_answers
  start_flink flink-tm1 taskmanager
  start_flink flink-tm2 taskmanager
  wait_for flink-tm1 90 flink_has_tms 2
  log "flink: JobManager REST on $HOST:$FLINK_REST, 2 TaskManagers x 2 slots"
}

# ---------------------------------------------------------------- Spark standalone
# env, not a function: launch runs it under setsid. Executors run Python with the project's interpreter.
SPARK_CLASS=(env SPARK_HOME="$SPARK_DIST" SPARK_LOCAL_IP="$HOST" SPARK_DAEMON_MEMORY=384m
             PYSPARK_PYTHON="$PYTHON" "$SPARK_DIST/bin/spark-class")
spark_workers() { curl -sf "http://$HOST:$SPARK_UI/json/" 2>/dev/null | sed -n 's/.*"aliveworkers" *: *\([0-9]*\).*/\1/p'; }
spark_answers() { [ -n "$(spark_workers)" ]; }
spark_has_worker() { [ "$(spark_workers)" = 1 ]; }

start_spark_master() {
  local name=spark-master dir="$SERVICES_DIR/spark-master"
  if owned_pid "$name" >/dev/null; then return 0; fi
  port_open "$SPARK_PORT" && die "port $SPARK_PORT is taken; set HEADWATER_SPARK_MASTER_PORT"
  mkdir -p "$dir"
  printf 'spark.master.rest.enabled false\n' > "$dir/spark.conf"
  launch "$name" "${SPARK_CLASS[@]}" org.apache.spark.deploy.master.Master --host "$HOST" --port "$SPARK_PORT" \
    --webui-port "$SPARK_UI" --properties-file "$dir/spark.conf"
  log "$name: started (pid $(cat "$dir/$name.pid"), spark://$HOST:$SPARK_PORT)"
}

start_spark_worker() {
  local name=spark-worker dir="$SERVICES_DIR/spark-worker"
  if owned_pid "$name" >/dev/null; then return 0; fi
  mkdir -p "$dir/work"
  : > "$dir/spark.conf"
  launch "$name" "${SPARK_CLASS[@]}" org.apache.spark.deploy.worker.Worker --host "$HOST" --cores 2 --memory 2g \
    --webui-port $((SPARK_UI + 1)) --work-dir "$dir/work" --properties-file "$dir/spark.conf" \
    "spark://$HOST:$SPARK_PORT"
  log "$name: started (pid $(cat "$dir/$name.pid"))"
}

spark_up() {
  [ -x "$SPARK_DIST/bin/spark-class" ] || die "no Spark in $SPARK_DIST: run 'make setup'"
  start_spark_master
  wait_for spark-master 60 spark_answers
  start_spark_worker
  wait_for spark-worker 60 spark_has_worker
  log "spark: master spark://$HOST:$SPARK_PORT, 1 worker (2 cores, 2g)"
}

# ---------------------------------------------------------------- whole profile
PARTS=(spark-worker spark-master flink-tm2 flink-tm1 flink-jm kafka-3 kafka-2 kafka-1)

up() {
  mkdir -p "$SERVICES_DIR"
  bash "$INFRA_DIR/redis-cluster.sh" start
  kafka_up
  flink_up
  spark_up
  log "cluster profile up: HEADWATER_KAFKA_BOOTSTRAP=$KAFKA_BOOTSTRAP HEADWATER_REDIS_URL=redis-cluster://$HOST:${HEADWATER_REDIS_CLUSTER_PORT:-7000}"
  log "  headwater run realtime --jobmanager $HOST:$FLINK_REST; --master spark://$HOST:$SPARK_PORT"
}

down() {
  local part
  for part in "${PARTS[@]}"; do
    case "$part" in
      kafka-*) ;;
      *) stop_owned "$part" ;;
    esac
  done
  # The brokers at once: the last one alone has no controller quorum left for a clean shutdown.
  for part in kafka-3 kafka-2 kafka-1; do stop_owned "$part" & done
  wait
  bash "$INFRA_DIR/redis-cluster.sh" stop
}

status() {
  local bad=0 n
  bash "$INFRA_DIR/redis-cluster.sh" status || bad=1
  if kafka_healthy 5; then echo "kafka: up on $KAFKA_BOOTSTRAP"; else echo "kafka: down"; bad=1; fi
  for n in 1 2 3; do owned_pid "kafka-$n" >/dev/null && echo "  kafka-$n: running" || echo "  kafka-$n: stopped"; done
  echo "flink: $(flink_tms || true) TaskManagers registered at http://$HOST:$FLINK_REST"
  flink_has_tms 2 || bad=1
  echo "spark: $(spark_workers || true) workers alive at spark://$HOST:$SPARK_PORT"
  spark_has_worker || bad=1
  return "$bad"
}

start_part() {
  mkdir -p "$SERVICES_DIR"
  case "$1" in
    flink-jm) start_flink flink-jm jobmanager ;;
    flink-tm1 | flink-tm2) start_flink "$1" taskmanager ;;
    spark-master) start_spark_master ;;
    spark-worker) start_spark_worker ;;
    kafka-1 | kafka-2 | kafka-3) start_kafka_node "${1#kafka-}" ;;
    *) die "unknown part $1 (one of ${PARTS[*]})" ;;
  esac
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  start) start_part "${2:?usage: $0 start NAME}" ;;
  stop) stop_owned "${2:?usage: $0 stop NAME}" ;;
  *) echo "usage: $0 up|down|status|start NAME|stop NAME" >&2; exit 2 ;;
esac
