#!/bin/sh
# A new connection through the relay at a wide-area latency: every link
# (client <-> node, executor <-> node) crosses a proxy that delays each byte
# by ONE_WAY_MS (crates/relay/examples/delay_proxy.rs). Times N runs of
# `exec-server run --registry ... -- true` (a new client process: /connect, relay
# socket, Noise handshake, initialize, spawn, exit) against our executor and,
# when `codex-ref` is installed, the reference executor behind the same node.
# (The bearer is one that cannot occur in a relay URL: the reference refuses a
# registration answer whose url contains its bearer.)
# Usage: scripts/relay-delay.sh [N] [ONE_WAY_MS], after the release builds of
# exec-server and the delay_proxy example. Every process is stopped by PID.
set -eu
BIN=${BIN:-target/release/exec-server}
PROXY=${PROXY:-target/release/examples/delay_proxy}
N=${1:-20}
MS=${2:-25}
dir=$(mktemp -d)
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
. "$(dirname "$0")/wait-line.sh"
# The node's port is fixed before it starts so its --public-url can name the proxy.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$PROXY" "127.0.0.1:$port" "$MS" >"$dir/proxy" &
pids="$pids $!"
paddr=$(wait_line "$dir/proxy")
"$BIN" registry --listen "127.0.0.1:$port" --public-url "http://$paddr" >"$dir/registry" 2>/dev/null &
pids="$pids $!"
wait_line "$dir/registry" >/dev/null
url="http://$paddr"
echo executor-bearer-0123456789 | "$BIN" --remote "$url" --environment-id ours --registration-bearer-stdin 2>/dev/null &
pids="$pids $!"
envs="ours"
if command -v codex-ref >/dev/null 2>&1; then
    echo executor-bearer-0123456789 | codex-ref exec-server --remote "$url" --environment-id ref --registration-bearer-stdin >"$dir/ref.log" 2>&1 &
    pids="$pids $!"
    envs="ours ref"
fi
export CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN=bench
for env in $envs; do
    i=0
    until "$BIN" run --registry "$url" --environment "$env" -- true 2>/dev/null; do
        i=$((i + 1)); [ $i -lt 100 ] || { echo "$env never reachable" >&2; head -20 "$dir/ref.log" >&2 || true; exit 1; }; sleep 0.2
    done
done
# Two clients: one that names the working directory (as Codex always does),
# whose process/start goes out right behind initialize, and one that asks the
# server for its cwd first (initialize answered before the start is sent).
for env in $envs; do
    for how in "--cwd /tmp" ""; do
        : >"$dir/times"
        for _ in $(seq "$N"); do
            t0=$(date +%s%N)
            # shellcheck disable=SC2086
            "$BIN" run --registry "$url" --environment "$env" $how -- true
            t1=$(date +%s%N)
            echo $(( (t1 - t0) / 1000 )) >>"$dir/times"
        done
        label=${how:-"(server cwd)"}
        sort -n "$dir/times" | awk -v env="$env" -v ms="$MS" -v how="$label" '{a[NR]=$1} END {printf "%s executor, %s ms one way, run %s: new connection to exit of true p50 %.1f ms, min %.1f ms, max %.1f ms (%d runs)\n", env, ms, how, a[int((NR+1)/2)]/1000, a[1]/1000, a[NR]/1000, NR}'
    done
done
