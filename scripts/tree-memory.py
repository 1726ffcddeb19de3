#!/usr/bin/env python3
import asyncio, json, subprocess, re, sys, os, time, tempfile
u = None
import websockets

# Memory of a server's process tree with N commands running (issue 34, item
# 3): proportional set size (Pss, shared pages split among their users) of
# the server and every descendant, summed, before and with N `sleep`s alive.
# Usage: tree-memory.py "SERVER-CMD --listen ws://127.0.0.1:0" N [sandbox]
HOLD = 120
N=int(sys.argv[2]) if len(sys.argv)>2 else 500
SB={}
if len(sys.argv)>3 and sys.argv[3]=='sandbox':
    WS=tempfile.mkdtemp(prefix='tree-memory-')
    u='file://'+WS
    ent=lambda k,a: {"path":{"type":"special","value":{"kind":k}},"access":a}
    SB={"sandbox":{"windowsSandboxLevel":"disabled","cwd":u,"workspaceRoots":[u],"permissions":{"type":"managed","network":"restricted","file_system":{"type":"restricted","entries":[ent("root","read"),ent("project_roots","write")]}}}}
def rss_tree(pid):
    # sum RSS of pid and all descendants
    kids={}
    for p in os.listdir('/proc'):
        if not p.isdigit(): continue
        try:
            st=open(f'/proc/{p}/stat').read()
            ppid=int(st.rsplit(')',1)[1].split()[1])
            kids.setdefault(ppid,[]).append(int(p))
        except Exception: pass
    tot=0; n=0; stack=[pid]; own=0
    while stack:
        q=stack.pop()
        try:
            for l in open(f'/proc/{q}/smaps_rollup'):
                if l.startswith('Pss:'):
                    v=int(l.split()[1]); tot+=v; n+=1
                    if q==pid: own=v
        except Exception: pass
        stack+=kids.get(q,[])
    return tot, n, own
async def main():
    cmd=sys.argv[1].split()
    p=subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url=None
    while url is None:
        m=re.search(r'(ws://127\.0\.0\.1:\d+)', p.stdout.readline())
        if m: url=m.group(1)
    async with websockets.connect(url, max_size=None) as ws:
        i=0
        async def call(method, params):
            nonlocal i
            i+=1; await ws.send(json.dumps({"id":i,"method":method,"params":params}))
            while True:
                m=json.loads(await ws.recv())
                if m.get("id")==i: return m
        await call("initialize",{"clientName":"rss"})
        await ws.send(json.dumps({"method":"initialized","params":{}}))
        base=rss_tree(p.pid)
        for k in range(N):
            r=await call("process/start",{"processId":f"s{k}","argv":["sleep",str(HOLD)],"cwd":u if SB else "file:///tmp","env":{"PATH":"/usr/bin:/bin"},"tty":False,"pipeStdin":False,"arg0":None, **SB})
            if "error" in r: print(r); break
        await asyncio.sleep(1.0)
        tot,n,own=rss_tree(p.pid)
        print(f"{cmd[0]}: base {base[0]/1024:.1f} MB; with {N}: tree {tot/1024:.1f} MB over {n} processes; server itself {own/1024:.1f} MB; per process {(tot-base[0])/N:.0f} KiB (server share {(own-base[2])/N:.0f} KiB)")
    p.terminate()
    p.wait(timeout=30)
asyncio.run(main())
