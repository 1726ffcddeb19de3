# Sourced by the benchmark scripts: `wait_line FILE` waits (at most 10 s)
# until FILE has a line (a server printing its URL) and prints that line.
wait_line() { i=0; while [ ! -s "$1" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done; head -n1 "$1"; }
