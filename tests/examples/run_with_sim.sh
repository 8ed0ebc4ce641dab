#!/bin/sh
# Run an event-loop example against a provider simulator of its own:
#   run_with_sim.sh SIM EXAMPLE [SIMULATOR FLAGS...]
# starts SIM on a free loopback port (its first stdout line is the port),
# runs EXAMPLE http://127.0.0.1:PORT/v1/chat/completions, stops SIM, and
# exits with the example's status. Each step is bounded.
set -eu
sim=$1 example=$2
shift 2
out=$(mktemp)
"$sim" --port 0 --quiet "$@" >"$out" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$out"' EXIT
tries=0
while [ ! -s "$out" ]; do
  tries=$((tries + 1))
  if [ "$tries" -gt 200 ]; then
    echo "run_with_sim.sh: $sim printed no port within 10 s" >&2
    exit 1
  fi
  sleep 0.05
done
port=$(head -n 1 "$out")
timeout 60 "$example" "http://127.0.0.1:$port/v1/chat/completions"
