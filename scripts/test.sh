#!/usr/bin/env bash
# The whole test suite: unit and integration tests and both fuzzers for a
# bounded time. Everything here needs only this checkout. When the public
# conformance suite is beside it (../shared, or SHARED_DIR=...), as in CI, it
# runs too, against the release binary.
set -euo pipefail
cd "$(dirname "$0")/.."

# One profile for everything: the tests reuse the release build of the binary.
cargo build --release --workspace --all-targets
cargo test --release --workspace --no-fail-fast

# The fuzzers, briefly (run them for longer by hand: --seconds 600).
FUZZ_SECONDS=${FUZZ_SECONDS:-15}
# They were built above with the workspace's features; `cargo run -p` would
# build a second copy of the dependencies with one package's features.
for fuzzer in fuzz_decode fuzz_router fuzz_relay; do
  "target/release/examples/$fuzzer" --seconds "$FUZZ_SECONDS"
done

shared=${SHARED_DIR:-../shared}
if [ -f "$shared/conformance/run.py" ]; then
  if ! python3 -c 'import websockets' 2>/dev/null; then
    python3 -m pip install --quiet websockets
  fi
  python3 "$shared/conformance/run.py" \
    --server-cmd "target/release/exec-server --listen ws://127.0.0.1:0" \
    "$shared/conformance/cases"
else
  echo "note: no conformance suite at $shared/conformance; skipped (set SHARED_DIR to run it)" >&2
fi
