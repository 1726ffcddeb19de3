#!/bin/sh
# Idle executor sockets on one registry node: starts a release registry,
# attaches N idle executors to it (crates/relay/examples/idle_executors.rs)
# and prints the node's RSS per executor. Usage: scripts/idle-executors.sh [N]
# after `cargo build --release -p exec-server-cli --bin exec-server` and
# `cargo build --release -p exec-server-relay --example idle_executors`.
# The registry is stopped by PID.
set -eu
BIN=${BIN:-target/release/exec-server}
BENCH=${BENCH:-target/release/examples/idle_executors}
dir=$(mktemp -d)
"$BIN" registry --listen 127.0.0.1:0 >"$dir/registry" 2>/dev/null &
reg=$!
trap 'kill $reg 2>/dev/null || true; rm -rf "$dir"' EXIT INT TERM
. "$(dirname "$0")/wait-line.sh"
"$BENCH" "$(wait_line "$dir/registry")" "$reg" "${1:-1000}"
