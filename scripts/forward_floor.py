#!/usr/bin/env python3
"""The least CPU any relay node can spend forwarding a stream on this machine.

Streams BYTES (default 2 GiB) over loopback TCP through a forwarder process
that does nothing but move bytes from one socket to the other, and prints the
CPU seconds the forwarder used:

  copy    recv_into a 1 MiB buffer, then send it: the two kernel copies every
          forwarder that looks at the bytes pays (a relay node must: RFC 6455
          makes clients mask every frame with a fresh key, so the node unmasks
          each byte before it can route or send it on);
  splice  socket -> pipe -> socket with splice(2), the bytes never copied to
          user space: possible only for payloads the node may pass on
          unchanged, which masked frames are not.

Usage: scripts/forward_floor.py [BYTES]   (BENCHMARKS.md, "the floor")
"""

import fcntl
import os
import resource
import socket
import sys
import threading
import time

F_SETPIPE_SZ = 1031
BUF = 1 << 20


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def forward_copy(src, dst):
    buf = bytearray(BUF)
    view = memoryview(buf)
    while True:
        n = src.recv_into(buf)
        if not n:
            return
        dst.sendall(view[:n])


def forward_splice(src, dst):
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, BUF)
    while True:
        n = os.splice(src.fileno(), w, BUF)
        if not n:
            return
        while n:
            n -= os.splice(r, dst.fileno(), n)


def sink(server, total, done):
    conn, _ = server.accept()
    buf = bytearray(BUF)
    got = 0
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        got += n
    conn.close()
    done.append(got == total)


def run(mode, total):
    sink_srv = socket.create_server(("127.0.0.1", 0))
    fwd_srv = socket.create_server(("127.0.0.1", 0))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        src, _ = fwd_srv.accept()
        dst = socket.create_connection(sink_srv.getsockname())
        before = cpu_seconds()
        (forward_copy if mode == "copy" else forward_splice)(src, dst)
        used = cpu_seconds() - before
        dst.close()
        os.write(write_end, f"{used:.3f}".encode())
        os._exit(0)
    os.close(write_end)
    done = []
    t = threading.Thread(target=sink, args=(sink_srv, total, done))
    t.start()
    src = socket.create_connection(fwd_srv.getsockname())
    chunk = memoryview(bytes(256 * 1024))
    start = time.monotonic()
    sent = 0
    while sent < total:
        src.sendall(chunk[: min(len(chunk), total - sent)])
        sent += min(len(chunk), total - sent)
    src.close()
    t.join(timeout=120)
    used = os.read(read_end, 64).decode()
    os.waitpid(pid, 0)
    wall = time.monotonic() - start
    ok = "all bytes" if done == [True] else "BYTES LOST"
    print(f"{mode:>6}: forwarder {used} CPU-s for {total >> 20} MiB ({wall:.2f} s wall, {ok})")


def main():
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 2 << 30
    for mode in ("copy", "splice"):
        run(mode, total)


if __name__ == "__main__":
    main()
