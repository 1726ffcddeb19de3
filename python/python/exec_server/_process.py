"""``Process``: a started process, its output as async iterators, its stdin."""

from __future__ import annotations

import asyncio
import collections
import signal as _signal
from typing import Any, AsyncIterator, Deque, Dict, List, NamedTuple, Optional, Tuple, Union

from . import _native

__all__ = ["Process", "OutputChunk", "Exited", "CompletedProcess"]

#: Output taken from the Rust client per round trip into Python, at most.
BATCH_BYTES = 4 * 1024 * 1024

_SIGNALS = {
    _signal.SIGINT: "interrupt",
    _signal.SIGTERM: "terminate",
    _signal.SIGKILL: "kill",
    _signal.SIGHUP: "hangup",
    _signal.SIGQUIT: "quit",
    _signal.SIGUSR1: "user1",
    _signal.SIGUSR2: "user2",
    _signal.SIGCONT: "continue",
    _signal.SIGSTOP: "stop",
    _signal.SIGWINCH: "windowChange",
}


class OutputChunk(NamedTuple):
    """Output, in the order the process wrote it: ``stream`` is
    ``"stdout"``, ``"stderr"`` or ``"pty"`` (a PTY's output, stderr merged)."""

    stream: str
    data: bytes


class Exited(NamedTuple):
    """How the process ended: ``exit_code`` (128+N for signal N), the
    ``signal`` that ended it (``"SIGKILL"``...) and the ``limit`` that fired
    (``"wallTimeout"``...), when the server reports them."""

    exit_code: int
    signal: Optional[str]
    limit: Optional[str]


class CompletedProcess(NamedTuple):
    """What :meth:`Environment.run` returns, like ``subprocess.run``:
    unpacks as ``(exit_code, stdout, stderr)``."""

    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def returncode(self) -> int:
        """``exit_code``, under ``subprocess``'s name."""
        return self.exit_code


Event = Union[OutputChunk, Exited]


class Process:
    """A process started by :meth:`Environment.start`.

    Read its output with ``async for chunk in proc`` (every
    :class:`OutputChunk` in order), or per stream with ``async for data in
    proc.stdout`` / ``proc.stderr``; :meth:`wait` returns the exit code.
    Output is never lost to a dropped connection: the client resumes the
    session and reads on from the last chunk it had.

    Cancelling :meth:`wait` (or an iteration) does not kill the process and
    loses no output: the next call goes on where it stopped, and output
    ``wait`` passed over stays for :attr:`stdout` and :meth:`communicate`.
    Only :meth:`terminate` (or :meth:`signal`) ends the process.
    """

    def __init__(self, native: _native.Process) -> None:
        self._native = native
        self._lock = asyncio.Lock()
        self._pending: "Optional[asyncio.Future[List[Tuple[Any, ...]]]]" = None
        self._buffers: Dict[str, Deque[bytes]] = {
            "stdout": collections.deque(),
            "stderr": collections.deque(),
        }
        self._kept: "set[str]" = set()
        self._ready: Deque[Event] = collections.deque()
        self._exited: Optional[Exited] = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<Process {self.id} pid={self.pid} exit={self.returncode}>"

    @property
    def id(self) -> str:
        """The process id (unique in its session)."""
        return self._native.id

    @property
    def pid(self) -> Optional[int]:
        """The OS pid on the server's host, when the server reports it."""
        return self._native.pid

    @property
    def returncode(self) -> Optional[int]:
        """The exit code once known, else ``None``."""
        return self._exited.exit_code if self._exited else None

    @property
    def exited(self) -> Optional[Exited]:
        """How the process ended, once known."""
        return self._exited

    async def _fetch(self) -> List[Tuple[Any, ...]]:
        # The native call is shielded and kept: a caller cancelled while it
        # runs leaves its result for the next caller, so no event is lost.
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._native.next_events(BATCH_BYTES))
        batch = await asyncio.shield(self._pending)
        self._pending = None
        return batch

    async def _next_event(self) -> Optional[Event]:
        """The next event in order, or ``None`` once the process closed."""
        while not self._ready:
            if self._closed:
                return None
            async with self._lock:
                if self._ready or self._closed:
                    continue
                batch = await self._fetch()
                if not batch:
                    self._closed = True
                for ev in batch:
                    if ev[0] == "output":
                        self._ready.append(OutputChunk(ev[1], ev[2]))
                    elif ev[0] == "exited":
                        self._exited = Exited(ev[1], ev[2], ev[3])
                        self._ready.append(self._exited)
                    else:
                        self._closed = True
        return self._ready.popleft()

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[OutputChunk]:
        while True:
            ev = await self._next_event()
            if ev is None:
                return
            if isinstance(ev, OutputChunk):
                yield ev

    async def events(self) -> AsyncIterator[Event]:
        """Every event in order: :class:`OutputChunk`, then :class:`Exited`
        (output may follow it: what background jobs still write)."""
        while True:
            ev = await self._next_event()
            if ev is None:
                return
            yield ev

    async def _stream_chunk(self, stream: str) -> Optional[bytes]:
        buf = self._buffers[stream]
        while not buf:
            ev = await self._next_event()
            if ev is None:
                return None
            if isinstance(ev, OutputChunk):
                name = "stdout" if ev.stream == "pty" else ev.stream
                if name == stream or name in self._kept:
                    self._buffers[name].append(ev.data)
        return buf.popleft()

    async def _stream(self, stream: str) -> AsyncIterator[bytes]:
        # Reading one stream keeps the other's chunks for its reader.
        self._kept.update(("stdout", "stderr"))
        while True:
            data = await self._stream_chunk(stream)
            if data is None:
                return
            yield data

    @property
    def stdout(self) -> AsyncIterator[bytes]:
        """Standard output (a PTY's whole output), chunk by chunk. While it is
        read, stderr's chunks are kept for :attr:`stderr`."""
        return self._stream("stdout")

    @property
    def stderr(self) -> AsyncIterator[bytes]:
        """Standard error, chunk by chunk (stdout's chunks are kept meanwhile)."""
        return self._stream("stderr")

    async def wait(self, *, discard_output: bool = False) -> int:
        """Waits for the exit and returns its code (128+N for signal N).

        Output not yet read is kept for :attr:`stdout`, :attr:`stderr` and
        :meth:`communicate` (so a cancelled or finished ``wait()`` loses
        nothing); with ``discard_output`` it is dropped instead, for a
        command whose output is not wanted and may be large."""
        while self._exited is None:
            ev = await self._next_event()
            if ev is None:
                break
            if isinstance(ev, OutputChunk) and not discard_output:
                name = "stdout" if ev.stream == "pty" else ev.stream
                self._buffers[name].append(ev.data)
        if self._exited is None:
            from .errors import EventsLost

            raise EventsLost(f"process {self.id} closed without an exit status")
        return self._exited.exit_code

    async def communicate(self) -> CompletedProcess:
        """Reads all output until the process closes; returns
        ``(exit_code, stdout, stderr)`` (a PTY's output as stdout). Output
        read so far is kept across a cancellation, so a later call returns
        it all."""
        while True:
            ev = await self._next_event()
            if ev is None:
                break
            if isinstance(ev, OutputChunk):
                name = "stdout" if ev.stream == "pty" else ev.stream
                self._buffers[name].append(ev.data)
        code = await self.wait()
        out = b"".join(self._buffers["stdout"])
        err = b"".join(self._buffers["stderr"])
        self._buffers["stdout"].clear()
        self._buffers["stderr"].clear()
        return CompletedProcess(code, out, err)

    async def write(self, data: Union[bytes, bytearray, memoryview, str]) -> str:
        """Writes to stdin (a ``str`` as UTF-8). A write retried after a
        dropped connection is applied once. Returns ``"accepted"``, or
        ``"stdinClosed"`` when stdin is not (or no longer) writable."""
        if isinstance(data, int):
            raise TypeError("write() takes bytes or str, not an int")
        raw = data.encode() if isinstance(data, str) else bytes(data)
        return await self._native.write(raw)

    async def close_stdin(self) -> str:
        """Closes stdin: the process reads end of file."""
        return await self._native.close_stdin()

    async def resize(self, rows: int, cols: int) -> None:
        """Resizes the PTY."""
        await self._native.resize(rows, cols)

    async def signal(self, sig: Union[int, str]) -> None:
        """Sends a signal to the process's group: a ``signal.Signals`` value
        or its wire name (``"interrupt"``, ``"terminate"``, ``"kill"``...)."""
        if isinstance(sig, str):
            name = sig
        else:
            try:
                name = _SIGNALS[_signal.Signals(sig)]
            except (KeyError, ValueError):
                raise ValueError(f"signal {sig} cannot be sent through exec-server") from None
        await self._native.signal(name)

    async def terminate(self) -> str:
        """Kills the process and everything it started. Returns
        ``"killedRunning"``, ``"killedLeftovers"`` or ``"nothingToDo"``."""
        return await self._native.terminate()
