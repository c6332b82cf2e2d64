#!/usr/bin/env bash
# Run a command with Kafka and Redis up, then stop only the services this run started.
#   infra/with-services.sh COMMAND [ARGS...]
# Services that were already running (started earlier by `make services-up`, or not by headwater)
# are left running. The command's exit status is returned.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

started=()
owned_pid redis >/dev/null || port_open "$REDIS_PORT" || started+=(redis)
owned_pid kafka >/dev/null || port_open "$KAFKA_PORT" || started+=(kafka)

cleanup() {
  local name
  for name in "${started[@]}"; do "$INFRA_DIR/$name.sh" stop || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$INFRA_DIR/services.sh" up || exit 1
"$@"
