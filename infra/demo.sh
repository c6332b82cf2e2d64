#!/usr/bin/env bash
# The headwater demo on the embedded local default. `make demo` runs it with Kafka and Redis up
# (infra/with-services.sh) and stops what it started afterwards; this script stops the tiers and
# the ranking service it starts, whatever happens.
#
#   1. registry: check, then apply (Feast objects + one plan per tier)
#   2. the realtime (Flink) and nearline (Kafka + RocksDB) tiers start
#   3. 75 s of generated traffic (crosses a nearline minute boundary)
#   4. online values of the busiest user, straight from Redis
#   5. offline: land the events in Delta, compute today's offline views, materialize
#   6. ranking: train the model, start the service, rank 500 candidates
set -euo pipefail
cd "$(dirname "$0")/.."
HW=.venv/bin/headwater
PY=.venv/bin/python
RUN_DIR=.headwater/demo
DURATION=${HEADWATER_DEMO_SECONDS:-75}
RATE=${HEADWATER_DEMO_RATE:-1000}
PORT=${HEADWATER_SERVE_PORT:-8080}
mkdir -p "$RUN_DIR"
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
step() { printf '\n\033[1m== %s\033[0m  (%s)\n' "$*" "$(date +%T)"; }
background() {  # background NAME CMD...: start in its own process group, log to $RUN_DIR/NAME.log
  local name=$1; shift
  setsid "$@" > "$RUN_DIR/$name.log" 2>&1 &
  pids+=($!)
  echo "started $name (pid $!, log $RUN_DIR/$name.log)"
}

step "1. Registry: check features/ against SLAs and the budget, then apply"
$HW check features/
$HW apply features/

step "2. Start the realtime (PyFlink) and nearline (Kafka + RocksDB) tiers"
background realtime $HW run realtime
background nearline $HW run nearline
sleep 20  # the Flink mini-cluster takes ~20 s to start; events produced meanwhile wait in Kafka

step "3. Produce ${DURATION} s of generated behaviour events at ${RATE} events/s"
$HW events produce --rate "$RATE" --duration "$DURATION" --seed 7 > "$RUN_DIR/produce.json"
cat "$RUN_DIR/produce.json"
sleep 10  # let the watermark pass the last boundaries

step "4. Online values of the busiest user (Redis, written by the tiers)"
$HW events tail --from-beginning --max 20000 --timeout 10 2>/dev/null \
  | $PY -c 'import collections, json, sys
users = collections.Counter(json.loads(line)["user_id"] for line in sys.stdin)
print(users.most_common(1)[0][0])' > "$RUN_DIR/user"
USER_ID=$(cat "$RUN_DIR/user")
echo "busiest user: $USER_ID"
$HW online get user_session_realtime "$USER_ID"
$HW online get user_engagement_nearline "$USER_ID"
cleanup; pids=()

step "5. Offline: land events in Delta, compute today's offline views, materialize to Redis"
$HW run landing
$HW run offline --date "$(date -u +%F)"
$HW materialize

step "6. Ranking: train the model, start the service, rank 500 candidates"
$HW model train --events 100000 --epochs 2
$HW model seed-features --events 100000
background serve $HW serve --port "$PORT"
for _ in $(seq 1 60); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break; sleep 1; done
curl -sf "http://127.0.0.1:$PORT/health"; echo
$PY - "$PORT" <<'PYEOF'
import json, sys, urllib.request
port = sys.argv[1]
body = {"user_id": "u000001", "candidates": [f"i{n:06d}" for n in range(1, 501)], "k": 10, "priority": "high"}
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/rank", data=json.dumps(body).encode(),
                             headers={"content-type": "application/json"})
answer = json.load(urllib.request.urlopen(req, timeout=10))
print(f"model {answer['model_version']}  fallback {answer['fallback']}  feature ages {answer['feature_ages_s']}")
for rank, item in enumerate(answer["items"], 1):
    print(f"  {rank:2d}. {item['item_id']}  {item['score']:.4f}")
PYEOF

step "done: the tiers and the service are stopped; Kafka and Redis stop with make demo"
