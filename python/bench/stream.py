"""Throughput of a stream read through the Python SDK against the Rust
client (the `exec-server run` CLI) on the same server, in one run.

    python python/bench/stream.py [--mib 256] [--rounds 5] [--bin target/release/exec-server]

Starts `exec-server --listen ws://127.0.0.1:0`, then alternates: the CLI
runs `head -c N /dev/zero` with its output to /dev/null; Python starts the
same command and counts the bytes of `proc.stdout`. Prints MiB/s per round
and the ratio of medians (BENCHMARKS.md, "Python SDK").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from pathlib import Path

from exec_server import Environment

ROOT = Path(__file__).resolve().parents[2]


async def python_round(url: str, nbytes: int) -> float:
    async with Environment.connect(url) as env:
        await env.run("true")  # connected and warm
        start = time.perf_counter()
        proc = await env.start(["head", "-c", str(nbytes), "/dev/zero"])
        got = 0
        async for data in proc.stdout:
            got += len(data)
        await proc.wait()
        elapsed = time.perf_counter() - start
    assert got == nbytes, (got, nbytes)
    return nbytes / elapsed / (1 << 20)


def rust_round(binary: str, url: str, nbytes: int) -> float:
    start = time.perf_counter()
    subprocess.run(
        [binary, "run", "--connect", url, "--", "head", "-c", str(nbytes), "/dev/zero"],
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return nbytes / (time.perf_counter() - start) / (1 << 20)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "exec-server"))
    a = ap.parse_args()
    nbytes = a.mib << 20
    server = subprocess.Popen([a.bin, "--listen", "ws://127.0.0.1:0"], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().decode().strip()
        py, rs = [], []
        for i in range(a.rounds):
            rs.append(rust_round(a.bin, url, nbytes))
            py.append(asyncio.run(python_round(url, nbytes)))
            print(f"round {i + 1}: rust client {rs[-1]:.0f} MiB/s, python {py[-1]:.0f} MiB/s", flush=True)
        r, p = statistics.median(rs), statistics.median(py)
        print(f"{a.mib} MiB, median of {a.rounds}: rust {r:.0f} MiB/s, python {p:.0f} MiB/s, ratio {p / r:.2f}")
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
