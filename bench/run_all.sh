#!/usr/bin/env bash
# Run every benchmark in bench/ (each prints its figures and writes bench/results/<name>.json).
# Expects Kafka and Redis up: `make bench` wraps this in infra/with-services.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
rc=0
for script in bench/bench_*.py; do
  echo "== $script"
  .venv/bin/python "$script" || { echo "!! $script failed"; rc=1; }
done
exit $rc
