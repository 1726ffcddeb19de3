#!/bin/sh
# Remote-mode benchmark on loopback: one release exec-server serving directly,
# our registry+relay, and an executor behind it; then relay_bench drives both.
# Usage: scripts/relay-bench.sh [SPAWNS] [IDLE]   (after the two release builds
# named in BENCHMARKS.md). EXEC names the server and executor program (default
# ours; EXEC="codex-ref exec-server" measures the reference's behind our
# registry and relay, with our client). Every process started here is stopped
# by PID.
set -eu
BIN=${BIN:-target/release/exec-server}
BENCH=${BENCH:-target/release/examples/relay_bench}
dir=$(mktemp -d)
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
EXEC=${EXEC:-$BIN}
$EXEC --listen ws://127.0.0.1:0 >"$dir/direct" 2>/dev/null &
pids="$pids $!"
"$BIN" registry --listen 127.0.0.1:0 >"$dir/registry" 2>/dev/null &
pids="$pids $!"
. "$(dirname "$0")/wait-line.sh"
direct=$(wait_line "$dir/direct")
registry=$(wait_line "$dir/registry")
# A bearer that cannot occur in a relay URL (the reference refuses a
# registration answer whose url contains its bearer).
echo executor-bearer-0123456789 | $EXEC --remote "$registry" --environment-id bench --registration-bearer-stdin >/dev/null 2>&1 &
exec_pid=$!
pids="$pids $exec_pid"
"$BENCH" "$direct" "$registry" bench "$exec_pid" "${1:-300}" "${2:-100}"
