#!/usr/bin/env python3
# Server RSS after N short commands (25 KB of output each), then every 5 s
# for 70 s: exited processes are dropped 30 s after their exit, and the
# allocator's free memory is given back within the next 30 s.
# Usage: scripts/rss-after-starts.py BINARY N   (needs the websockets package)
import asyncio, json, sys, subprocess, base64, re, time, os
import websockets
BIN=sys.argv[1]; N=int(sys.argv[2])
def rss(pid): return int([l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")][0].split()[1])
async def main():
    p = subprocess.Popen([BIN, "--listen", "ws://127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    url = re.search(r"ws://\S+", p.stdout.readline()).group(0)
    try:
        async with websockets.connect(url, ping_interval=None, max_size=None) as c:
            await c.send(json.dumps({"id": 0, "method": "initialize", "params": {"clientName": "s"}})); await c.recv()
            await c.send(json.dumps({"method": "initialized"}))
            nid = 1
            for i in range(N):
                await c.send(json.dumps({"id": nid, "method": "process/start", "params": {"processId": f"p{i}", "argv": ["/bin/sh", "-c", "head -c 25000 /dev/zero | tr '\\0' x"], "cwd": "file:///tmp", "env": {"PATH": "/usr/bin:/bin"}, "tty": False}})); nid += 1
                while True:
                    m = json.loads(await c.recv())
                    if m.get("method") == "process/closed": break
            print(f"after {N}: rss {rss(p.pid)} KiB")
            for k in range(14):
                await asyncio.sleep(5)
                print(f"  +{5*(k+1)} s: rss {rss(p.pid)} KiB")
    finally:
        p.terminate(); p.wait()
asyncio.run(main())
