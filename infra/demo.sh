#!/usr/bin/env bash
# The headwater demo on the embedded local default. `make demo` runs it with Kafka and Redis up
# (infra/with-services.sh) and stops what it started afterwards; this script stops the tiers and
# the ranking service it starts, whatever happens.
#
#   0. a clean slate: the demo's topics, Redis keys and .headwater state of an earlier demo go
#   1. registry: check (the CI gate), then apply (Feast objects + one plan per tier)
#   2. two days of history into Kafka, for both example sources (behaviour events and payments); the
#      nearline tier starts and catches up on it (the realtime tier's windows are minutes long: it
#      starts at the live traffic, with --from-latest)
#   3. offline: land the history in Delta, compute every view per day, label the impressions,
#      build a point-in-time training set, train the ranker from it, materialize to Redis
#   4. live: the ranking service and the push API start (both with a generated API key); generated
#      traffic streams to Kafka, live payments through the push API; rankings are requested and a
#      click is posted, which changes the user's realtime features and the next ranking
#   5. freshness of every view against its SLA, judged after each tier's catch-up (table + HTML page
#      from one report)
#   6. a registry change while the tiers run: a new nearline view is planned, applied, backfilled from
#      Kafka by the restarted nearline tier and served; the other views keep their state; then
#      online/offline consistency of every nearline view, the new one included; the experiment's
#      CTR per arm, the prediction skew of the service's logged scores and the served features'
#      drift against the training set (headwater monitor)
set -euo pipefail
cd "$(dirname "$0")/.."
HW=.venv/bin/headwater
PY=.venv/bin/python
RUN_DIR=.headwater/demo
HISTORY_EVENTS=${HEADWATER_DEMO_HISTORY_EVENTS:-60000}
PAYMENT_EVENTS=${HEADWATER_DEMO_PAYMENT_EVENTS:-6000}  # the second source: payments, keyed by account
DURATION=${HEADWATER_DEMO_SECONDS:-120}
RATE=${HEADWATER_DEMO_RATE:-1000}
PORT=${HEADWATER_SERVE_PORT:-8080}
URL="http://127.0.0.1:$PORT"
INGEST_PORT=${HEADWATER_INGEST_PORT:-8090}
INGEST_URL="http://127.0.0.1:$INGEST_PORT"
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
started_at=$(date +%s)
watched=()  # "NAME PID" of the background steps that must run until the demo stops them
background() {  # background NAME CMD...: start in its own process group, log to $RUN_DIR/NAME.log
  local name=$1; shift
  setsid "$@" > "$RUN_DIR/$name.log" 2>&1 &
  pids+=($!)
  echo "started $name (pid $!, log $RUN_DIR/$name.log)"
}
service() {  # service NAME CMD...: a background step that must not stop on its own (a tier, a server)
  background "$@"
  watched+=("$1 ${pids[-1]}")
}
unwatch() {  # unwatch NAME: the demo is about to stop it
  local entry kept=()
  for entry in "${watched[@]}"; do [ "${entry%% *}" = "$1" ] || kept+=("$entry"); done
  watched=("${kept[@]}")
}
died() {  # died NAME WHAT: say which step failed and show its log's tail, then stop the demo
  echo "demo: the $1 step $2; the last lines of $RUN_DIR/$1.log:" >&2
  tail -n 30 "$RUN_DIR/$1.log" >&2
  exit 1
}
check_alive() {  # a tier or server that died would leave every later figure untrue: stop here instead
  local entry state
  for entry in "${watched[@]}"; do
    state=$(ps -o stat= -p "${entry##* }" 2>/dev/null || true)
    if [ -z "$state" ] || [ "${state:0:1}" = Z ]; then died "${entry%% *}" "(pid ${entry##* }) stopped on its own"; fi
  done
}
finished() {  # finished NAME PID: wait for a finite background step; its failure stops the demo
  wait "$2" || died "$1" "failed (exit $?)"
}
step() {
  check_alive
  printf '\n\033[1m== %s\033[0m  (%s, %ss in)\n' "$*" "$(date +%T)" "$(($(date +%s) - started_at))"
}

step "0. A clean slate: remove the topics, Redis keys and state of an earlier demo"
$PY infra/demo_reset.py
mkdir -p "$RUN_DIR"

step "1. Registry: check features/ against SLAs and the budget, then apply"
$HW check features/
$HW apply features/

step "2. Two days of history into Kafka (${HISTORY_EVENTS} events); the nearline tier starts on it"
$HW events produce --history 2d --max-events "$HISTORY_EVENTS" --seed 11 --quiet
$HW events produce --source payments --history 2d --max-events "$PAYMENT_EVENTS" --seed 12 --quiet
service nearline $HW run nearline
nearline_pid=${pids[-1]}

step "3. Offline: land in Delta, compute the views per day, label, build the training set, train, materialize"
today=$(date -u +%F)
first=$(date -u -d '2 days ago' +%F)
second=$(date -u -d '1 day ago' +%F)  # labels from here: the first day has no complete past
# Daily views up to yesterday: today has not ended, so no value "as of its end" exists yet.
$HW run landing
$HW run offline --backfill "$first" "$second"  # realtime/nearline views: at each label's time, from bronze
$HW labels --from "$second" --out "$RUN_DIR/labels.parquet"
$HW training-set --labels "$RUN_DIR/labels.parquet" --out "$RUN_DIR/train.parquet"
$HW model train --training-set "$RUN_DIR/train.parquet" --epochs 3
# The funnel's other models, from the same training set: the two-tower retriever over the whole
# catalog, the re-ranker over each user's recent clicks; and the items' categories for diversity.
$HW retrieval train --training-set "$RUN_DIR/train.parquet" --epochs 5
$HW funnel train-reranker --training-set "$RUN_DIR/train.parquet"
$HW funnel categories
$HW materialize

step "4. Live: the realtime tier, the ranking service and the push API, ${DURATION} s of traffic at ${RATE} events/s, a click"
service realtime $HW run realtime --from-latest
# The demo's calls carry a generated API key (HEADWATER_API_KEY); the service holds only its hash.
rm -f "$RUN_DIR/api-keys.yaml"
HEADWATER_API_KEY=$($PY -c 'import sys; from pathlib import Path; from headwater.serving.auth import add_api_key
print(add_api_key(Path(sys.argv[1]), "demo", ["rank", "feedback", "admin", "ingest"]))' "$RUN_DIR/api-keys.yaml")
export HEADWATER_API_KEY
service serve $HW serve --port "$PORT" --config infra/demo/serving.yaml
# The push API (a process of its own): the live payments arrive through it, checked, keyed and sent
# to Kafka as `events produce` would; the same key, with its `ingest` role.
service ingest $HW ingest serve --port "$INGEST_PORT" --rejects-to dlq --config infra/demo/serving.yaml
for _ in $(seq 1 120); do grep -q "realtime job .*submitted" "$RUN_DIR/realtime.log" && break; sleep 1; done
for _ in $(seq 1 90); do curl -sf "$URL/health" > /dev/null && break; sleep 1; done
curl -sf "$URL/health"; echo
for _ in $(seq 1 60); do curl -sf "$INGEST_URL/health" > /dev/null && break; sleep 1; done
curl -sf "$INGEST_URL/health"; echo
background traffic $HW events produce --rate "$RATE" --duration "$DURATION" --seed 7 --quiet
traffic_pid=${pids[-1]}
background payments $HW ingest push --source payments --rate 50 --duration "$DURATION" --seed 8 --url "$INGEST_URL"
payments_pid=${pids[-1]}
traffic_started=$(date +%s)
sleep 20
$PY infra/demo_loop.py --url "$URL" --wait 30
# The funnel: retrieval from the whole catalog, the seen filter, the DCN, the re-ranker, the rules.
$PY infra/demo/recommend.py --url "$URL" --user "$(cat "$RUN_DIR/loop_user")"
# Many users through the service: the experiment's arms get impressions and clicks, and a sample of the
# answers is logged for `headwater skew` (the generated traffic carries no arm). The users are drawn
# from the labels (active users, by impressions) plus 5% new ones, so a fallback that is a fault shows.
$PY infra/demo/experiment_traffic.py --url "$URL" --users 300 --users-from "$RUN_DIR/labels.parquet"
check_alive
$HW online get user_session_realtime "$(cat "$RUN_DIR/loop_user")"
# The second source through every tier: realtime payment velocity, nearline merchant risk (behind a
# repartition by merchant_id), offline spend (materialized from Delta).
$HW online get account_payments_realtime account-00000 account-00001
$HW online get merchant_risk_nearline merchant-00000 merchant-00001
$HW online get account_spend_offline account-00000 account-00001

step "5. Freshness of every view against its SLA (while the traffic flows); online/offline consistency"
sleep $((DURATION - 15 - $(date +%s) + traffic_started)) 2>/dev/null || true
# A short window at the end of the live traffic, each view judged from when its tier caught up: the
# realtime job starts on a backlog (what arrived while it started) and the nearline backfill's writes
# are days behind by design; the catch-up column shows how long that took. One report, two renderings:
# the table here and the HTML page say the same views and verdicts.
$HW freshness --window 30s --after-catch-up --html-out "$RUN_DIR/freshness.html" || true  # exit 1: see the table

step "6. Change the registry while it runs: add a nearline view, plan, apply, restart nearline"
cp -r features "$RUN_DIR/features-next"
cp infra/demo/account_methods_nearline.yaml "$RUN_DIR/features-next/"
$HW plan "$RUN_DIR/features-next"  # one view to add, and how it is backfilled; nothing else restarts
applied_at=$(date +%s%N)
$HW apply "$RUN_DIR/features-next" --no-feast
unwatch nearline
kill -TERM -- "-$nearline_pid" 2>/dev/null || true
wait "$nearline_pid" 2>/dev/null || true
service nearline-next $HW run nearline
for _ in $(seq 1 240); do  # served = its values are in the store (after the backfill)
  $HW online get account_methods_nearline account-00000 --format json 2>/dev/null | grep -q '"found": true' && break
  sleep 0.5
done
echo "account_methods_nearline served $(( ($(date +%s%N) - applied_at) / 1000000 )) ms after apply"
$HW online get account_methods_nearline account-00000 account-00001
finished traffic "$traffic_pid"
finished payments "$payments_pid"
sleep 10  # the watermarks pass the last boundaries before the tiers stop
check_alive
cleanup; pids=(); watched=()
$HW run landing > /dev/null  # the live events too, so offline can recompute what the tiers wrote
$HW consistency --tier nearline --sample 200  # both sources; realtime skipped the history: see bench/bench_soak.py
# One line each. Exit 1 is a verdict (the split is flagged; a model's |online - offline| score is over
# 0.003 against the point-in-time features) and the demo goes on; exit 2 (no figures) stops it.
$HW experiment report --config infra/demo/serving.yaml --format line || [ $? -eq 1 ]
$HW skew --topic demo.predictions --format line || [ $? -eq 1 ]
# Feature monitoring: the served values (the log skew just landed) against the training set the
# model learnt from and each feature's expect: block; its breach lines go to a file, the summary here.
$HW monitor --baseline "$RUN_DIR/train.parquet" --topic demo.predictions > "$RUN_DIR/monitor.txt" || [ $? -eq 1 ]
tail -n 1 "$RUN_DIR/monitor.txt"

step "done in $(($(date +%s) - started_at)) s: the tiers and the service are stopped; Kafka and Redis stop with make demo"
