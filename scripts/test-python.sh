#!/usr/bin/env bash
# The Python SDK (python/): lint its Rust half, build the wheel with maturin,
# install it into a virtual environment (target/pyenv), type-check the
# package and its examples (mypy --strict), and run its tests (pytest)
# against this checkout's exec-server binary (built by scripts/test.sh).
#
# The SDK's crate is a workspace of its own (maturin builds it as an
# extension module); it shares the root's target directory and profiles,
# so the client library is not compiled twice.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${PROFILE:-ci}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
case "$TARGET" in /*) ;; *) TARGET=$PWD/$TARGET ;; esac
VENV=$TARGET/pyenv

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  'maturin>=1.9,<2' 'pytest>=8' 'pytest-asyncio>=0.24' 'mypy>=1.10'

(cd python && cargo fmt -- --check)
(cd python && CARGO_TARGET_DIR=$TARGET cargo clippy --profile "$PROFILE" -- -D warnings)

rm -rf "$TARGET/wheels"
(cd python && CARGO_TARGET_DIR=$TARGET "$VENV/bin/maturin" build --quiet \
  --profile "$PROFILE" --interpreter "$VENV/bin/python" --out "$TARGET/wheels")
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  --force-reinstall --no-deps "$TARGET"/wheels/exec_server-*.whl

# The package's own sources, then the examples against the installed wheel
# (its stubs and py.typed must be what mypy sees).
(cd python/python && "$VENV/bin/mypy" --strict exec_server)
(cd python && "$VENV/bin/mypy" --strict examples)
(cd python && EXEC_SERVER_BIN=$TARGET/$PROFILE/exec-server \
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests)
