#!/bin/sh
# Remote-mode benchmark on loopback: one release exec-server serving directly,
# our registry+relay, and an executor behind it; then relay_bench drives both.
# Usage: scripts/relay-bench.sh [SPAWNS] [IDLE]   (after the two release builds
# named in BENCHMARKS.md). Every process started here is stopped by PID.
set -eu
BIN=${BIN:-target/release/exec-server}
BENCH=${BENCH:-target/release/examples/relay_bench}
dir=$(mktemp -d)
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
"$BIN" --listen ws://127.0.0.1:0 >"$dir/direct" 2>/dev/null &
pids="$pids $!"
"$BIN" registry --listen 127.0.0.1:0 >"$dir/registry" 2>/dev/null &
pids="$pids $!"
for f in direct registry; do
    i=0
    while [ ! -s "$dir/$f" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
done
direct=$(head -n1 "$dir/direct")
registry=$(head -n1 "$dir/registry")
echo bench | "$BIN" --remote "$registry" --environment-id bench --registration-bearer-stdin 2>/dev/null &
exec_pid=$!
pids="$pids $exec_pid"
"$BENCH" "$direct" "$registry" bench "$exec_pid" "${1:-300}" "${2:-100}"
