#!/usr/bin/env bash
# The whole test suite: unit and integration tests, the decoder fuzzer for a
# bounded time, and the public conformance suite against the release binary.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c 'import websockets' 2>/dev/null; then
  python3 -m pip install --quiet websockets
fi

# One profile for everything: the tests reuse the release build of the binary.
cargo build --release --workspace --all-targets
cargo test --release --workspace --no-fail-fast

# The fuzzers, briefly (run them for longer by hand: --seconds 600).
FUZZ_SECONDS=${FUZZ_SECONDS:-15}
cargo run --release -q -p exec-server-protocol --example fuzz_decode -- --seconds "$FUZZ_SECONDS"
cargo run --release -q -p exec-server --example fuzz_router -- --seconds "$FUZZ_SECONDS"
cargo run --release -q -p exec-server-relay --example fuzz_relay -- --seconds "$FUZZ_SECONDS"

shared=${SHARED_DIR:-../shared}
if [ -f "$shared/conformance/run.py" ]; then
  python3 "$shared/conformance/run.py" \
    --server-cmd "target/release/exec-server --listen ws://127.0.0.1:0" \
    "$shared/conformance/cases"
else
  echo "conformance suite not found at $shared/conformance (set SHARED_DIR)" >&2
  exit 1
fi
