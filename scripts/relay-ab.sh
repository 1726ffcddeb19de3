#!/bin/bash
# Two builds of exec-server side by side, each with its own direct server,
# registry node and executor on loopback; 2 GiB streams (`run … -- head -c 2G
# /dev/zero >/dev/null`) through each build's relay and directly, ROUNDS
# times, interleaved. Prints per run: wall seconds relay and direct, their
# ratio, and the CPU seconds of the node, the executor and the direct server
# (from /proc/PID/stat). BENCHMARKS.md ("session 38") has a run.
# Usage: scripts/relay-ab.sh OLD_BINARY NEW_BINARY [ROUNDS]
# Every process started here is stopped by PID.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 OLD_BINARY NEW_BINARY [ROUNDS]" >&2; exit 2; }
declare -A BIN D N E R U
BIN[old]=$1
BIN[new]=$2
ROUNDS=${3:-3}
dir=$(mktemp -d)
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
. "$(dirname "$0")/wait-line.sh"
cpu() { awk -v t="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / t}' "/proc/$1/stat"; }
for tag in old new; do
    "${BIN[$tag]}" --listen ws://127.0.0.1:0 >"$dir/$tag.direct" 2>/dev/null &
    D[$tag]=$!; pids="$pids $!"
    "${BIN[$tag]}" registry --listen 127.0.0.1:0 >"$dir/$tag.reg" 2>/dev/null &
    N[$tag]=$!; pids="$pids $!"
    R[$tag]=$(wait_line "$dir/$tag.reg")
    U[$tag]=$(wait_line "$dir/$tag.direct")
    echo executor-bearer-0123456789 | "${BIN[$tag]}" --remote "${R[$tag]}" --environment-id ab --registration-bearer-stdin >/dev/null 2>&1 &
    E[$tag]=$!; pids="$pids $!"
done
export CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN=ab
now() { date +%s.%N; }
for r in $(seq "$ROUNDS"); do
    for tag in old new; do
        b=${BIN[$tag]}
        n0=$(cpu "${N[$tag]}"); e0=$(cpu "${E[$tag]}"); t0=$(now)
        # `run` waits (bounded) for the executor to attach on its first use.
        "$b" run --registry "${R[$tag]}" --environment ab --cwd /tmp -- head -c 2G /dev/zero >/dev/null
        t1=$(now); n1=$(cpu "${N[$tag]}"); e1=$(cpu "${E[$tag]}")
        d0=$(cpu "${D[$tag]}"); t2=$(now)
        "$b" run --connect "${U[$tag]}" --cwd /tmp -- head -c 2G /dev/zero >/dev/null
        t3=$(now); d1=$(cpu "${D[$tag]}")
        awk -v r="$r" -v tag="$tag" -v t0="$t0" -v t1="$t1" -v t2="$t2" -v t3="$t3" \
            -v nn0="$n0" -v nn1="$n1" -v e0="$e0" -v e1="$e1" -v d0="$d0" -v d1="$d1" 'BEGIN {
            printf "%s %s relay %.2f s direct %.2f s direct/relay %.2f node %.2f executor %.2f server %.2f\n",
                r, tag, t1 - t0, t3 - t2, (t3 - t2) / (t1 - t0), nn1 - nn0, e1 - e0, d1 - d0 }'
    done
done
