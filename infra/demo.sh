#!/usr/bin/env bash
# The headwater demo on the embedded local default. `make demo` runs it with Kafka and Redis up
# (infra/with-services.sh) and stops what it started afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
HW=.venv/bin/headwater
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. Registry: validate features/ against SLAs and the budget"
$HW check features/

step "2. Produce 5 s of generated behaviour events at 2,000 events/s"
$HW events produce --rate 2000 --duration 5 --seed 7

step "3. Read the stream back and summarise it"
$HW events tail --from-beginning --max 200000 --timeout 10 --summary-only

step "done"
