#!/usr/bin/env bash
# Builds the sandbox's inner stage for x86_64-unknown-linux-musl and puts it
# beside the server of a build profile as `exec-server-inner-musl`, which the
# server prefers to the workspace's own `exec-server-inner` when both are of
# its sandbox sources (crates/sandbox/src/inner_program.rs): musl's start
# skips glibc's CPU probing, about 1 ms of CPU per sandboxed start on a
# hypervisor that traps `cpuid`.
#
#   scripts/build-inner.sh [PROFILE]     # ci (default, as scripts/test.sh), release, dev
#
# Optional: without it the server uses the workspace's build. When the musl
# target is missing it is added with rustup; with neither, this says so and
# exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-${PROFILE:-ci}}
TARGET=x86_64-unknown-linux-musl
ROOT=${CARGO_TARGET_DIR:-target}
case "$PROFILE" in
  dev) DIR=debug ;;
  *) DIR=$PROFILE ;;
esac

if [ "$(uname -m)" != x86_64 ]; then
  echo "note: not x86_64; the musl inner stage is not built (the server uses its own)" >&2
  exit 0
fi
if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
  if ! command -v rustup >/dev/null 2>&1 || ! rustup target add "$TARGET" >&2; then
    echo "note: the Rust target $TARGET is not installed and cannot be added here; the musl inner stage is not built (the server uses its own)" >&2
    exit 0
  fi
fi
cargo build --profile "$PROFILE" --locked --manifest-path crates/inner/Cargo.toml \
  --target "$TARGET" --target-dir "$ROOT"
mkdir -p "$ROOT/$DIR"
# Replaced, not written over: a running server may be executing the old one.
cp "$ROOT/$TARGET/$DIR/exec-server-inner" "$ROOT/$DIR/.exec-server-inner-musl.tmp"
mv -f "$ROOT/$DIR/.exec-server-inner-musl.tmp" "$ROOT/$DIR/exec-server-inner-musl"
echo "built $ROOT/$DIR/exec-server-inner-musl" >&2
