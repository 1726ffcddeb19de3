# Sourced by the CLI benchmarks: starts "$SERVER_CMD" (default: "$BIN"
# listening on loopback) with its URL in $URL and its PID in $SERVER, and
# stops it and removes $WORK on exit. Needs $BIN and $WORK.
SERVER_CMD=${SERVER_CMD:-"$BIN --listen ws://127.0.0.1:0"}
$SERVER_CMD >"$WORK/url" 2>"$WORK/server.log" &
SERVER=$!
cleanup() {
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 100); do
    [ -s "$WORK/url" ] && break
    sleep 0.05
done
URL=$(head -1 "$WORK/url")
