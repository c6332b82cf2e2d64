# Shared helpers for the infra/ scripts. Sourced, not run.
# Ports and paths are overridable by environment variables; the services' state lives under
# $HEADWATER_SERVICES_DIR (default infra/state/, git-ignored), apart from the platform's HEADWATER_STATE_DIR.

INFRA_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT_DIR="$(cd "$INFRA_DIR/.." && pwd)"
SERVICES_DIR="${HEADWATER_SERVICES_DIR:-$INFRA_DIR/state}"
PYTHON="${HEADWATER_PYTHON:-$ROOT_DIR/.venv/bin/python}"
HOST="${HEADWATER_HOST:-127.0.0.1}"
KAFKA_PORT="${HEADWATER_KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${HEADWATER_KAFKA_CONTROLLER_PORT:-9093}"
REDIS_PORT="${HEADWATER_REDIS_PORT:-6379}"
export HEADWATER_HOST="$HOST" HEADWATER_KAFKA_PORT="$KAFKA_PORT" HEADWATER_REDIS_PORT="$REDIS_PORT"

log() { printf '[infra] %s\n' "$*" >&2; }
die() { printf '[infra] error: %s\n' "$*" >&2; exit 1; }

# port_open PORT: true when something accepts TCP connections on HOST:PORT.
port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# owned_pid NAME: the pid recorded by our own start, if that process is still ours and alive.
# A pid file alone is not proof (pids are reused): the process must name our state dir on its
# command line (Kafka) or run inside it (redis-server rewrites its title but chdirs to --dir).
owned_pid() {
  local dir="$SERVICES_DIR/$1" pid
  [ -f "$dir/$1.pid" ] || return 1
  pid="$(cat "$dir/$1.pid")"
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  if tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "$dir" \
     || [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$dir" ]; then
    echo "$pid"
    return 0
  fi
  return 1
}

# launch NAME CMD...: start CMD in the background as NAME, in its own session (setsid: a test's kill of
# its process group never reaches it), with NAME's state folder as its working directory, output to
# NAME/NAME.log, pid in NAME/NAME.pid. The folder is entered *before* the fork, so the child is
# recognisable by owned_pid from its first instant: judging a child by its command line before it has
# exec'd (the cmdline is still the shell's) reported healthy starts as "exited during start" (issue 37).
launch() {
  local name=$1 dir="$SERVICES_DIR/$1"
  shift
  mkdir -p "$dir"
  (
    cd "$dir" || exit 1
    setsid "$@" > "$dir/$name.log" 2>&1 < /dev/null &
    echo $! > "$dir/$name.pid"
  )
  [ -s "$dir/$name.pid" ] || die "$name: could not be launched (no pid recorded in $dir)"
}

# wait_for NAME SECONDS CHECK...: every 0.5 s until CHECK succeeds; die if NAME's own process (launch's
# child, told apart by owned_pid) has ended, or after SECONDS. The one start-up wait of every script.
wait_for() {
  local name=$1 seconds=$2 i
  shift 2
  for i in $(seq 1 $((seconds * 2))); do
    owned_pid "$name" >/dev/null || die "$name exited during start; see $SERVICES_DIR/$name/$name.log"
    "$@" && return 0
    sleep 0.5
  done
  die "$name not healthy within $seconds s; see $SERVICES_DIR/$name/$name.log"
}

# stop_owned NAME: stop the process we started (TERM, then KILL after 30 s); never touches others.
stop_owned() {
  local name="$1" pid i
  if ! pid="$(owned_pid "$name")"; then
    log "$name: not started by headwater, nothing to stop"
    rm -f "$SERVICES_DIR/$name/$name.pid"
    return 0
  fi
  log "$name: stopping pid $pid"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$name: still running after 30 s, sending KILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$SERVICES_DIR/$name/$name.pid"
}
