"""Fixtures: the exec-server binary of this checkout, started on loopback
(stopped by PID), a registry with an executor, and a proxy that cuts
connections on demand."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import AsyncIterator, Iterator, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("EXEC_SERVER_BIN", ROOT / "target" / os.environ.get("PROFILE", "ci") / "exec-server"))


def _binary() -> str:
    if not BIN.exists():
        pytest.fail(f"no exec-server binary at {BIN}: build the workspace first (or set EXEC_SERVER_BIN)")
    return str(BIN)


class Server:
    """A started process whose first stdout line is its URL."""

    def __init__(self, args: List[str], stdin: Optional[bytes] = None, env: Optional[dict] = None) -> None:
        self.proc = subprocess.Popen(
            [_binary(), *args],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=env,
        )
        if stdin is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(stdin)
            self.proc.stdin.close()
        self.url = ""

    def read_url(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()
        if not line:
            raise RuntimeError(f"{self.proc.args} printed no URL (exit {self.proc.poll()})")
        self.url = line
        return line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def server() -> Iterator[Server]:
    """``exec-server --listen ws://127.0.0.1:0``."""
    s = Server(["--listen", "ws://127.0.0.1:0"])
    try:
        s.read_url()
        yield s
    finally:
        s.stop()


@pytest.fixture
def token_server(tmp_path: Path) -> Iterator[Tuple[Server, str]]:
    """A server that wants a capability token; yields it and the token."""
    token = "py-sdk-capability-token"
    (tmp_path / "token").write_text(token)
    s = Server(["--listen", "ws://127.0.0.1:0", "--ws-auth", "capability-token", "--ws-token-file", str(tmp_path / "token")])
    try:
        s.read_url()
        yield s, token
    finally:
        s.stop()


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Tuple[str, str]]:
    """A registry with one executor, ``pybox``; yields the registry URL and
    the harness token."""
    (tmp_path / "exec.tokens").write_text("pybox executor-secret\n")
    (tmp_path / "harness.tokens").write_text("harness-secret\n")
    reg = Server(
        [
            "registry",
            "--listen",
            "127.0.0.1:0",
            "--executor-tokens",
            str(tmp_path / "exec.tokens"),
            "--harness-tokens",
            str(tmp_path / "harness.tokens"),
        ]
    )
    executor: Optional[Server] = None
    try:
        url = reg.read_url()
        executor = Server(
            ["--remote", url, "--environment-id", "pybox", "--registration-bearer-stdin"],
            stdin=b"executor-secret\n",
        )
        yield url, "harness-secret"
    finally:
        if executor is not None:
            executor.stop()
        reg.stop()


class CuttingProxy:
    """A TCP proxy to ``target`` (host, port) that can cut every connection
    it carries: the client sees its connection drop mid-stream."""

    def __init__(self, target: Tuple[str, int]) -> None:
        self.target = target
        self.pairs: List[Tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self.server: Optional[asyncio.AbstractServer] = None
        self.cuts = 0

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"ws://127.0.0.1:{port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.pairs.append((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        """Aborts every connection now (a reset, as a network failure would)."""
        self.cuts += 1
        for a, b in self.pairs:
            a.transport.abort()
            b.transport.abort()
        self.pairs.clear()

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def cutting_proxy(server: Server) -> AsyncIterator[Tuple[CuttingProxy, str]]:
    host_port = server.url.removeprefix("ws://")
    host, port = host_port.rsplit(":", 1)
    proxy = CuttingProxy((host, int(port)))
    url = await proxy.start()
    try:
        yield proxy, url
    finally:
        await proxy.close()


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A temporary directory on this host (the servers run here too)."""
    with tempfile.TemporaryDirectory(prefix="exec-server-py-") as d:
        yield Path(d)


def wait_until(check, limit: float = 20.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while True:
        try:
            return check()
        except Exception:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)
