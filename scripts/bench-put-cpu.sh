#!/usr/bin/env bash
# Wall time and CPU time of `fs put` and `fs get` through our CLI and server
# (issue 15): the client's CPU from /usr/bin/time, the server's from
# /proc/PID/stat, one line per transfer. CPU time varies less than wall time
# on a shared host.
#
#   scripts/bench-put-cpu.sh [BINARY] [SIZE_MIB] [RUNS]
#   scripts/bench-put-cpu.sh target/release/exec-server 1024 3
set -euo pipefail

BIN=${1:-target/release/exec-server}
MIB=${2:-1024}
RUNS=${3:-3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-put.XXXXXX")
# shellcheck source=scripts/bench-server.sh
. "$(dirname "$0")/bench-server.sh"
head -c $((MIB * 1024 * 1024)) /dev/urandom >"$WORK/src"
cat "$WORK/src" >/dev/null # warm the page cache
tick=$(getconf CLK_TCK)
server_cpu() { awk -v t="$tick" '{print ($14 + $15) / t}' "/proc/$SERVER/stat"; }

# One transfer: `fs <verb> FROM TO`, timed.
measure() {
    local verb=$1 from=$2 to=$3 s0 s1 t0 t1
    rm -f "$to"
    s0=$(server_cpu)
    t0=$(date +%s%N)
    /usr/bin/time -o "$WORK/time" -f "%U %S" "$BIN" fs --connect "$URL" "$verb" "$from" "$to" >/dev/null 2>&1
    t1=$(date +%s%N)
    s1=$(server_cpu)
    echo "$verb wall $(((t1 - t0) / 1000000)) ms client $(awk '{print $1 + $2}' "$WORK/time") s server $(echo "$s1 - $s0" | bc) s"
}
for _ in $(seq "$RUNS"); do measure put "$WORK/src" "$WORK/put.out"; done
for _ in $(seq "$RUNS"); do measure get "$WORK/put.out" "$WORK/get.out"; done
cmp -s "$WORK/src" "$WORK/get.out" || {
    echo "contents differ" >&2
    exit 1
}
