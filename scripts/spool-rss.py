#!/usr/bin/env python3
"""Peak server memory while output goes through the spool.

Starts the server command, runs `head -c BYTES /dev/zero` on it from a client
that never acknowledges and only counts the pushed output, then pages the
whole output back with process/read (served from the spool), and prints the
server's peak RSS (VmHWM) and both byte counts. Loopback only.

    python3 scripts/spool-rss.py --bytes 1073741824 \
        -- target/release/exec-server --listen ws://127.0.0.1:0
"""
import argparse
import asyncio
import base64
import json
import subprocess
import time

import websockets


def kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = [c for c in a.cmd if c != "--"]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    url = server.stdout.readline().decode().strip()
    try:
        async with websockets.connect(url, max_size=None) as ws:
            next_id = [0]

            async def call(method, params):
                next_id[0] += 1
                my = next_id[0]
                await ws.send(json.dumps({"id": my, "method": method, "params": params}))
                while True:
                    m = json.loads(await ws.recv())
                    if m.get("id") == my:
                        if "error" in m:
                            raise RuntimeError(m["error"])
                        return m["result"]
                    if m.get("method") == "process/output":
                        pushed[0] += len(base64.b64decode(m["params"]["chunk"]))

            pushed = [0]
            await call("initialize", {"clientName": "spool-rss"})
            await ws.send(json.dumps({"method": "initialized"}))
            t0 = time.time()
            await call("process/start", {
                "processId": "big", "argv": ["head", "-c", str(a.bytes), "/dev/zero"],
                "cwd": "file:///", "env": {"PATH": "/usr/bin:/bin"}, "tty": False})
            # Take the pushed stream to the end (the close notification).
            while True:
                m = json.loads(await ws.recv())
                if m.get("method") == "process/output":
                    pushed[0] += len(base64.b64decode(m["params"]["chunk"]))
                elif m.get("method") == "process/closed":
                    break
            t_push = time.time() - t0
            # Page everything back from the start: memory window + spool.
            paged, after = 0, 0
            t1 = time.time()
            while True:
                r = await call("process/read", {"processId": "big", "afterSeq": after})
                for c in r["chunks"]:
                    assert c["seq"] == after + 1, (c["seq"], after)
                    after = c["seq"]
                    paged += len(base64.b64decode(c["chunk"]))
                if r["closed"]:
                    break
            t_page = time.time() - t1
            print(json.dumps({
                "bytes": a.bytes, "pushed": pushed[0], "paged_back": paged,
                "push_MiB_s": round(a.bytes / 1048576 / t_push, 1),
                "page_MiB_s": round(paged / 1048576 / t_page, 1),
                "server_peak_rss_kib": kib(server.pid, "VmHWM"),
            }))
    finally:
        server.terminate()
        server.wait(timeout=10)


asyncio.run(main())
