#!/bin/sh
# Where a relay stream's CPU goes, and the least it could be, on this machine.
# Streams 2 GiB (`head -c 2G /dev/zero`) with `exec-server run` directly,
# directly through a bare forwarder (examples/delay_proxy at 0 ms: one more
# hop, no framing, no crypto) and through our registry+relay, ROUNDS times
# each, interleaved, and prints per run: wall seconds, the CPU seconds the
# whole machine was busy (/proc/stat), and the node's, the executor's (or
# the direct server's) own. Then the two
# floors: the relay's encryption (examples/aead_cost) and a bare forwarder
# (scripts/forward_floor.py). BENCHMARKS.md explains the arithmetic.
# Usage: [SINK=null] scripts/relay-floor.sh [ROUNDS]   (after the release
# builds named in BENCHMARKS.md); SINK=null sends the output to /dev/null
# (its byte count then rests on `run`'s exit status) instead of `wc -c`.
# Every process started here is stopped by PID.
set -eu
BIN=${BIN:-target/release/exec-server}
AEAD=${AEAD:-target/release/examples/aead_cost}
PROXY=${PROXY:-target/release/examples/delay_proxy}
ROUNDS=${1:-3}
dir=$(mktemp -d)
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
"$BIN" --listen ws://127.0.0.1:0 >"$dir/direct" 2>/dev/null &
direct_pid=$!
pids="$pids $direct_pid"
"$BIN" registry --listen 127.0.0.1:0 >"$dir/registry" 2>/dev/null &
node_pid=$!
pids="$pids $node_pid"
. "$(dirname "$0")/wait-line.sh"
direct=$(wait_line "$dir/direct")
registry=$(wait_line "$dir/registry")
"$PROXY" "${direct#ws://}" 0 >"$dir/hop" &
pids="$pids $!"
hop="ws://$(wait_line "$dir/hop")"
echo executor-bearer-0123456789 | "$BIN" --remote "$registry" --environment-id floor --registration-bearer-stdin >/dev/null 2>&1 &
exec_pid=$!
pids="$pids $exec_pid"
export CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN=floor

# CPU seconds (user+system) a process has used.
cpu() { awk -v t="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / t}' "/proc/$1/stat"; }
# CPU seconds the whole machine has been busy (everything but idle and iowait).
busy() { awk -v t="$(getconf CLK_TCK)" '/^cpu /{printf "%.2f", ($2 + $3 + $4 + $7 + $8) / t}' /proc/stat; }
# Prints the run's figures; $1 names the path, $2.. are `run`'s connection flags.
stream() {
    name=$1
    shift
    b0=$(busy); n0=$(cpu $node_pid); e0=$(cpu $exec_pid); d0=$(cpu $direct_pid)
    t0=$(date +%s.%N)
    if [ "${SINK:-wc}" = null ]; then
        "$BIN" run "$@" -- head -c 2G /dev/zero >/dev/null
        got=2147483648
    else
        got=$("$BIN" run "$@" -- head -c 2G /dev/zero | wc -c)
    fi
    t1=$(date +%s.%N)
    b1=$(busy); n1=$(cpu $node_pid); e1=$(cpu $exec_pid); d1=$(cpu $direct_pid)
    [ "$got" = 2147483648 ] || { echo "$name: $got bytes, not 2 GiB" >&2; exit 1; }
    echo "$name $t0 $t1 $b0 $b1 $n0 $n1 $e0 $e1 $d0 $d1" | awk '{
        printf "%-6s wall %.2f s, machine busy %.2f CPU-s, node %.2f, executor %.2f, direct server %.2f\n",
            $1, $3 - $2, $5 - $4, $7 - $6, $9 - $8, $11 - $10 }'
}

# The executor attaches in the background: wait until a stream works.
i=0
until "$BIN" run --registry "$registry" --environment floor -- true 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "the executor did not attach" >&2; exit 1; }
    sleep 0.1
done
r=0
while [ $r -lt "$ROUNDS" ]; do
    stream direct --connect "$direct"
    stream hop --connect "$hop"
    stream relay --registry "$registry" --environment floor
    r=$((r + 1))
done
"$AEAD" 2048
python3 "$(dirname "$0")/forward_floor.py"
