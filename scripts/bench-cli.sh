#!/usr/bin/env bash
# Throughput of our CLI through a server over loopback WebSocket against the
# same work done locally (issue 15): `run -- head -c SIZE /dev/zero | wc -c`
# vs `head | wc`, and `fs put` / `fs get` of a SIZE file vs `cp` (page cache
# warm). Prints MiB/s per run and the server's peak RSS (VmHWM).
#
#   scripts/bench-cli.sh [BINARY] [SIZE_MIB] [RUNS]
#   scripts/bench-cli.sh target/release/exec-server 1024 3
#
# Set SERVER_CMD to measure another server with our CLI as the client, e.g.
# SERVER_CMD="codex-ref exec-server --listen ws://127.0.0.1:0".
set -euo pipefail

BIN=${1:-target/release/exec-server}
MIB=${2:-1024}
RUNS=${3:-3}
BYTES=$((MIB * 1024 * 1024))
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-cli.XXXXXX")
# shellcheck source=scripts/bench-server.sh
. "$(dirname "$0")/bench-server.sh"

head -c "$BYTES" /dev/urandom >"$WORK/src"
cat "$WORK/src" >/dev/null # warm the page cache

# Seconds a command takes (wall clock, nanosecond clock).
secs() {
    local t0 t1
    t0=$(date +%s%N)
    "$@"
    t1=$(date +%s%N)
    echo "scale=4; ($t1 - $t0) / 1000000000" | bc
}
rate() { echo "scale=1; $MIB / $1" | bc; }

check_count() {
    local n
    n=$("$@" | wc -c)
    [ "$n" -eq "$BYTES" ] || {
        echo "wrong byte count: $n" >&2
        exit 1
    }
}

local_stream() { check_count head -c "$BYTES" /dev/zero; }
ours_stream() { check_count "$BIN" run --connect "$URL" -- head -c "$BYTES" /dev/zero; }
local_cp() { cp "$WORK/src" "$WORK/cp.out"; }
ours_put() { "$BIN" fs --connect "$URL" put "$WORK/src" "$WORK/put.out" >/dev/null 2>&1; }
ours_get() { "$BIN" fs --connect "$URL" get "$WORK/put.out" "$WORK/get.out" >/dev/null 2>&1; }

printf '%-8s %12s %12s %12s %12s %12s\n' run "head|wc" "run|wc" cp "fs put" "fs get"
# Every copy starts from the same state: no dirty pages (`sync`, untimed),
# and its own output of the run before deleted just before it. So each one
# fills page cache freed a moment ago (or, in run 1, never used), whichever
# comes first: filling memory the VM's host took back costs several times
# more than filling memory just freed, and a copy that ran after another
# copy's output was deleted would otherwise get that memory and the other
# would not.
for r in $(seq "$RUNS"); do
    a=$(secs local_stream)
    b=$(secs ours_stream)
    rm -f "$WORK/cp.out"
    sync
    c=$(secs local_cp)
    rm -f "$WORK/put.out"
    sync
    d=$(secs ours_put)
    rm -f "$WORK/get.out"
    sync
    e=$(secs ours_get)
    cmp -s "$WORK/src" "$WORK/get.out" || {
        echo "fs get: contents differ" >&2
        exit 1
    }
    printf '%-8s %12s %12s %12s %12s %12s\n' "$r" "$(rate "$a")" "$(rate "$b")" "$(rate "$c")" "$(rate "$d")" "$(rate "$e")"
done
echo "MiB/s; server peak RSS: $(awk '/VmHWM/ {printf "%.1f MiB", $2/1024}' "/proc/$SERVER/status")"
