#!/usr/bin/env python3
"""Upgrade time: from `exec-server upgrade` to the first request the new
binary serves, with N running processes handed over.

Usage: scripts/upgrade-bench.py [BIN] [ROUNDS] [N...]
(default: target/release/exec-server, 5 rounds, N = 1 100 1000).

For each N: one server, N `sleep 600` processes in ceil(N/500) sessions,
then ROUNDS upgrades to a second copy of the binary. Each round times the
`exec-server upgrade` command (it returns once the new image serves), then
a resume of a session on a new connection (the first request served), and
checks every process still runs. Every process started here is stopped by
PID (the server's SIGTERM ends its process trees).
Needs `pip install websockets`.
"""
import asyncio
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import websockets


async def call(ws, i, method, params):
    await ws.send(json.dumps({"id": i, "method": method, "params": params}))
    while True:
        r = json.loads(await ws.recv())
        if r.get("id") == i:
            return r


async def session(url, resume=None):
    ws = await websockets.connect(url, max_size=None)
    params = {"clientName": "upgrade-bench"}
    if resume:
        params["resumeSessionId"] = resume
    r = await call(ws, 1, "initialize", params)
    if "result" not in r:
        await ws.close()
        return None, r
    await ws.send(json.dumps({"method": "initialized"}))
    return ws, r["result"]["sessionId"]


async def resume(url, sid, deadline=10.0):
    """Resumes `sid`, retrying while the old image's connection lingers."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            ws, got = await session(url, sid)
        except OSError:
            await asyncio.sleep(0.001)
            continue
        if ws is not None:
            return ws
        await asyncio.sleep(0.001)
    raise RuntimeError(f"could not resume {sid}")


async def bench(binary, copy, rounds, n):
    server = subprocess.Popen([binary, "--listen", "ws://127.0.0.1:0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        url = server.stdout.readline().decode().strip()
        sessions = []
        per = 500
        for s in range(math.ceil(n / per)):
            ws, sid = await session(url)
            for p in range(min(per, n - s * per)):
                r = await call(ws, 10 + p, "process/start", {
                    "processId": f"p{p}", "argv": ["sleep", "600"],
                    "cwd": "file:///tmp", "env": {"PATH": "/usr/bin:/bin"},
                    "tty": False})
                assert "result" in r, r
            sessions.append((sid, min(per, n - s * per)))
            await ws.close()
        command, served, reported = [], [], []
        for _ in range(rounds):
            t0 = time.monotonic()
            out = subprocess.run([binary, "upgrade", "--pid", str(server.pid),
                                  "--binary", copy], capture_output=True, text=True)
            t1 = time.monotonic()
            assert out.returncode == 0, out.stdout + out.stderr
            ws = await resume(url, sessions[0][0])
            t2 = time.monotonic()
            # "... in N ms: ..." as the server measured it.
            reported.append(float(out.stdout.split(" in ")[1].split(" ms")[0]))
            command.append((t1 - t0) * 1000)
            served.append((t2 - t0) * 1000)
            r = await call(ws, 2, "process/read",
                           {"processId": "p0", "afterSeq": 0, "waitMs": 0})
            assert r["result"]["exited"] is False, r
            await ws.close()
        # Every process survived every round.
        for sid, count in sessions:
            ws = await resume(url, sid)
            for p in range(count):
                r = await call(ws, 3 + p, "process/read",
                               {"processId": f"p{p}", "afterSeq": 0, "waitMs": 0})
                assert r["result"]["exited"] is False, (sid, p, r)
            await ws.close()
        return statistics.median(command), statistics.median(served), \
            statistics.median(reported), max(served)
    finally:
        server.terminate()
        server.wait(timeout=30)


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/exec-server")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    counts = [int(a) for a in sys.argv[3:]] or [1, 100, 1000]
    tmp = tempfile.mkdtemp()
    copy = os.path.join(tmp, "exec-server-next")
    shutil.copy(binary, copy)
    print("| processes | `upgrade` command p50 | to first request served p50 (max) | "
          "server-side p50 |")
    print("|---|---|---|---|")
    try:
        for n in counts:
            c, s, r, smax = asyncio.run(bench(binary, copy, rounds, n))
            print(f"| {n} | {c:.1f} ms | {s:.1f} ms ({smax:.1f}) | {r:.0f} ms |", flush=True)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
