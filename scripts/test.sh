#!/usr/bin/env bash
# The whole test suite: unit and integration tests and the fuzzers for a
# bounded time. Everything here needs only this checkout. When the public
# conformance suite is beside it (../shared, or SHARED_DIR=...), as in CI, it
# runs too, against the binary the tests used.
#
# Profile `ci` (Cargo.toml): release semantics, less optimisation, so the
# many test programs build in about half the time. PROFILE=release runs the
# same suite against the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${PROFILE:-ci}
OUT=${CARGO_TARGET_DIR:-target}/$PROFILE

# Unit and integration tests, and the binaries they start. Examples are not
# built here: the client's examples run inside its `examples` test, and
# clippy --all-targets (.ci/run) checks that every example compiles.
cargo test --profile "$PROFILE" --workspace --lib --bins --tests --no-run
# The sandbox's inner stage built for musl, beside the server the tests start
# (optional: skipped with a note where that target cannot be had).
./scripts/build-inner.sh "$PROFILE"
cargo test --profile "$PROFILE" --workspace --lib --bins --tests --no-fail-fast
cargo test --profile "$PROFILE" --workspace --doc

# The fuzzers, briefly (run them for longer by hand: --seconds 600). They are
# built once with the workspace's features; `cargo run -p` would build a
# second copy of the dependencies with one package's features.
FUZZ_SECONDS=${FUZZ_SECONDS:-10}
fuzzers=(fuzz_decode fuzz_router fuzz_relay)
cargo build --profile "$PROFILE" --workspace "${fuzzers[@]/#/--example=}"
for fuzzer in "${fuzzers[@]}"; do
  "$OUT/examples/$fuzzer" --seconds "$FUZZ_SECONDS"
done

# The Python SDK: its wheel built with maturin, installed into a virtual
# environment, type-checked and tested against the binary built above.
./scripts/test-python.sh

shared=${SHARED_DIR:-../shared}
if [ -f "$shared/conformance/run.py" ]; then
  if ! python3 -c 'import websockets' 2>/dev/null; then
    python3 -m pip install --quiet websockets
  fi
  python3 "$shared/conformance/run.py" \
    --server-cmd "$OUT/exec-server --listen ws://127.0.0.1:0" \
    "$shared/conformance/cases"
else
  echo "note: no conformance suite at $shared/conformance; skipped (set SHARED_DIR to run it)" >&2
fi
