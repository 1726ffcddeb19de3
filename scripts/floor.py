#!/usr/bin/env python3
"""Issue 34's one table, in one run: ours, the reference and the local floor
side by side for every row the issue names.

    cargo build --release -p exec-server-cli -p exec-server-bench
    scripts/build-inner.sh release      # the musl inner stage, as shipped
    python3 scripts/floor.py [OUR_BINARY] [REFERENCE_COMMAND]
    python3 scripts/floor.py target/release/exec-server codex-ref

Steps (each prints its own output first):
1. exec-server-bench, interleaved, 3 runs each, medians: `spawn` with ours,
   the reference, the local fork+exec+wait and `floor-server` (the least a
   server can do to answer `process/start`: the protocol's floor for this
   client on this machine); then spawn-sandboxed, spawn-sandboxed-paced,
   stream and fsread with both servers and ours with `--output-spool-bytes 0`;
2. scripts/tree-memory.py: 500 `sleep`s alive, Pss of the server's tree;
3. our CLI (`exec-server run`, embedded server) streaming 1 GiB into `wc -c`
   against `head -c 1G /dev/zero | wc -c` (5 runs each, medians).
Then the table, in Markdown, with each goal and whether it is met.
"""
import re
import statistics
import subprocess
import sys
import time

OURS = sys.argv[1] if len(sys.argv) > 1 else "target/release/exec-server"
REF = sys.argv[2] if len(sys.argv) > 2 else "codex-ref"
BENCH = "target/release/exec-server-bench"
LISTEN = "--listen ws://127.0.0.1:0"


def run(cmd):
    print("$", cmd, flush=True)
    out = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, text=True, check=True).stdout
    print(out, flush=True)
    return out


def bench(scenarios, servers):
    names = " ".join(f'--server "{name}={cmd}"' for name, cmd in servers)
    out = run(f"{BENCH} {names} --scenarios {scenarios} --runs 3")
    rows = {}
    columns = None
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:2] == ["scenario", "metric"]:
            columns = {name: i for i, name in enumerate(cells)}
        elif columns and len(cells) >= 5 and cells[0] and not cells[0].startswith("-"):
            rows[(cells[0], cells[1])] = {k: cells[i] for k, i in columns.items()}
    return rows


def tree_memory():
    found = {}
    for name, cmd in (("ours", f"{OURS} {LISTEN}"), ("ref", f"{REF} exec-server {LISTEN}")):
        out = run(f'python3 scripts/tree-memory.py "{cmd}" 500')
        m = re.search(r"with 500: tree ([\d.]+) MB", out)
        found[name] = m.group(1) if m else "?"
    return found


def cli_stream():
    def median_secs(cmd, n=5):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            out = subprocess.run(cmd, shell=True, capture_output=True, text=True, check=True)
            times.append(time.perf_counter() - t0)
            if out.stdout.strip() != str(1 << 30):
                raise SystemExit(f"wrong byte count from {cmd}: {out.stdout!r}")
        return statistics.median(times)

    local = median_secs("head -c 1G /dev/zero | wc -c")
    ours = median_secs(f"{OURS} run -- head -c 1G /dev/zero | wc -c")
    print(f"1 GiB: local pipe {local:.2f} s, exec-server run {ours:.2f} s", flush=True)
    return local, ours


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return float("nan")


def main():
    ours, ref = ("ours", f"{OURS} {LISTEN}"), ("ref", f"{REF} exec-server {LISTEN}")
    spawn = bench("spawn", [ours, ref, ("minimal", "target/release/floor-server")])
    # `nospool`: ours with the output spool off, to show what the spool
    # (retention past the reference's 1 MiB, issue 12) costs a stream.
    rows = bench(
        "spawn-sandboxed,spawn-sandboxed-paced,stream,fsread",
        [ours, ref, ("nospool", f"{OURS} {LISTEN} --output-spool-bytes 0")],
    )
    rows.update(spawn)
    tree = tree_memory()
    local_s, ours_s = cli_stream()
    def get(sc, metric, *names):
        row = rows.get((sc, metric), {})
        return [row.get(name, "?") for name in names]

    table = []

    def line(what, ours, ref, floor, goal, ratio, met):
        table.append(f"| {what} | {ours} | {ref} | {floor} | {goal} | {ratio:.2f}× | "
                     f"{'yes' if met else 'no'} |")

    o, r, l, m = get("spawn", "p50 ms", "ours", "ref", "local", "minimal")
    x = num(o) / num(l)
    line("spawn `true`, start → closed, p50 ms", o, r, l, "≤ 1.3× local", x, x <= 1.3)
    x = num(m) / num(l)
    line("spawn `true` from `floor-server` (the protocol's floor), p50 ms", m, "–", l,
         "≤ 1.3× local", x, x <= 1.3)
    for sc, how in (("spawn-sandboxed", "back to back"), ("spawn-sandboxed-paced", "50 ms apart")):
        o, r, l = get(sc, "p50 ms", "ours", "ref", "local")
        x = num(o) / num(l)
        line(f"sandboxed spawn, {how}, p50 ms", o, r, f"{l} (bare bwrap)", "≤ 1.0× bwrap", x,
             x <= 1.0)
    x = num(tree["ours"]) / num(tree["ref"])
    line("500 × `sleep`, tree Pss MB", tree["ours"], tree["ref"], "–", "≤ 1.0× reference", x,
         x <= 1.0)
    x = local_s / ours_s
    line("CLI 1 GiB into `wc -c`, MiB/s", f"{1024 / ours_s:.0f}", "–",
         f"{1024 / local_s:.0f} (pipe)", "≥ 0.8× pipe", x, x >= 0.8)
    for sc, what, bound in (("stream", "256 MiB streamed", 0.2), ("fsread", "64 MiB `fs/readFile`", 0.1)):
        o, r, n = get(sc, "server CPU ms", "ours", "ref", "nospool")
        x = num(o) / num(r)
        line(f"server CPU, {what}, ms", o, r, "–", f"≤ {bound}× reference", x, x <= bound)
        if sc == "stream":
            x = num(n) / num(r)
            line(f"server CPU, {what}, spool off, ms", n, r, "–", f"≤ {bound}× reference", x,
                 x <= bound)
    print("| what | ours | reference | local / floor | goal | ratio | met |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(table))


if __name__ == "__main__":
    main()
