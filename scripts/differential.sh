#!/usr/bin/env bash
# Runs the client-library integration tests against the reference server
# (the Codex CLI's exec-server 0.169.0) instead of ours, to show where they differ.
#   scripts/differential.sh            # installs @openai/codex@0.169.0 under target/ref
#   REF_BIN=/path/to/codex scripts/differential.sh
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${REF_BIN:-}" ]; then
  mkdir -p target/ref
  if [ ! -x target/ref/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex ]; then
    (cd target/ref && npm install --silent @openai/codex@0.169.0) || { echo "npm install failed" >&2; exit 1; }
  fi
  REF_BIN=$PWD/target/ref/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex
fi
echo "== client tests against the reference: $REF_BIN"
EXEC_SERVER_TEST_SERVER_CMD="$REF_BIN exec-server --listen ws://127.0.0.1:0" \
  cargo test --profile ci -p exec-server-cli --test integration -- client:: --test-threads 2
status=$?
echo "== exit $status (failures are differences from our server; see the note in BENCHMARKS.md / the issue)"
exit $status
