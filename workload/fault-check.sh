#!/usr/bin/env bash
# GPU machine: what an injected fault (`--inject-fault-after`) does to a neighbour, first
# with plain time-slicing (two processes, two contexts), then through a private MPS
# daemon. A victim serves yolos-small in a closed loop; an aggressor faults after 3 s.
# Prints the aggressor's exit code and last line, and the victim's inference count
# every half second. Changes no GPU setting; the MPS daemon it starts is stopped on
# every exit path. Usage: workload/fault-check.sh [WORKLOAD_BIN]
set -uo pipefail
BIN=${1:-target/release/gpushare-workload}
CONTROL=${MPS_CONTROL:-$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)}
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  if [ -S "$WORK/mps/pipe/control" ]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$WORK/mps/pipe "$CONTROL"
    sleep 1
  fi
}
trap cleanup EXIT

count() { curl -s "http://127.0.0.1:$1/metrics" | sed -n 's/^inference_time_seconds_count{[^}]*} //p'; }

scenario() {
  local name=$1 port_v=$2 port_a=$3
  echo "== $name"
  "$BIN" --model yolos-small --listen 127.0.0.1:$port_v >"$WORK/$name-victim.log" 2>&1 &
  local victim=$!
  PIDS+=("$victim")
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port_v/healthz" >/dev/null && break; sleep 0.1; done
  "$BIN" --model yolos-small --listen 127.0.0.1:$port_a --inject-fault-after 3s >"$WORK/$name-aggressor.log" 2>&1 &
  local aggressor=$!
  PIDS+=("$aggressor")
  for i in $(seq 16); do
    sleep 0.5
    local state=running
    kill -0 "$victim" 2>/dev/null || state=gone
    echo "t=$(awk "BEGIN{print $i*0.5}")s victim count=$(count $port_v) ($state)"
  done
  wait "$aggressor"; echo "aggressor exit $?: $(tail -n 1 "$WORK/$name-aggressor.log")"
  if kill -0 "$victim" 2>/dev/null; then
    echo "victim still serving"; kill -TERM "$victim"; wait "$victim"; echo "victim exit $? after SIGTERM"
  else
    wait "$victim"; echo "victim exit $?: $(tail -n 1 "$WORK/$name-victim.log")"
  fi
}

scenario time-slicing 19401 19402

mkdir -p "$WORK/mps/pipe" "$WORK/mps/log"
export CUDA_MPS_PIPE_DIRECTORY=$WORK/mps/pipe CUDA_MPS_LOG_DIRECTORY=$WORK/mps/log
"$CONTROL" -d && sleep 1
scenario mps 19411 19412
# After the fault: how long until a new client serves through the same daemon.
t0=$(date +%s.%N)
"$BIN" --model yolos-small --listen 127.0.0.1:19421 >"$WORK/mps-after.log" 2>&1 &
after=$!
PIDS+=("$after")
ok=no
for _ in $(seq 300); do curl -sf http://127.0.0.1:19421/healthz >/dev/null && { ok=yes; break; }; kill -0 $after 2>/dev/null || break; sleep 0.1; done
echo "a new MPS client after the fault: ready=$ok after $(awk "BEGIN{print $(date +%s.%N)-$t0}") s"
kill -TERM $after 2>/dev/null; wait $after; echo "new client exit $?: $(tail -n 1 "$WORK/mps-after.log")"
echo "-- MPS control log:"; cat "$WORK/mps/log/control.log"
echo "-- MPS server log (last 15 lines):"; tail -n 15 "$WORK/mps/log/server.log" 2>/dev/null
