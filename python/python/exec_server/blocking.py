"""The blocking twin of :mod:`exec_server`, for scripts and notebooks.

Every call runs the async API on one background event loop (a daemon
thread started on first use), so it works where an event loop already runs
in the calling thread (Jupyter) and where none does::

    from exec_server.blocking import Environment

    env = Environment.local()
    code, out, err = env.run(["uname", "-a"])
    proc = env.start(["sh", "-c", "for i in 1 2 3; do echo $i; done"])
    for data in proc.stdout:
        print(data.decode(), end="")
    print(proc.wait())
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, AsyncIterator, Awaitable, BinaryIO, Callable, Coroutine, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from . import _environment, _process
from ._command import Command
from ._environment import Change, Decide, DirEntry, HttpResponse, Metadata, PathLike
from ._process import CompletedProcess, Event, Exited, OutputChunk

__all__ = ["Environment", "Process", "connect"]

T = TypeVar("T")

_loop: Optional[asyncio.AbstractEventLoop] = None
_loop_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="exec-server", daemon=True).start()
            _loop = loop
        return _loop


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run_coroutine_threadsafe(coro, _background_loop()).result()


def _iterate(next_item: Callable[[], Awaitable[Optional[T]]]) -> Iterator[T]:
    async def one() -> Optional[T]:
        return await next_item()

    while True:
        item = _run(one())
        if item is None:
            return
        yield item


def _sync(items: AsyncIterator[T]) -> Iterator[T]:
    """An async iterator driven on the background loop, one item per call."""

    async def next_item() -> Optional[T]:
        try:
            return await items.__anext__()
        except StopAsyncIteration:
            return None

    return _iterate(next_item)


class Process:
    """A started process (see :class:`exec_server.Process`); its methods block."""

    def __init__(self, inner: _process.Process) -> None:
        self._inner = inner

    def __repr__(self) -> str:
        return repr(self._inner)

    @property
    def id(self) -> str:
        """The process id."""
        return self._inner.id

    @property
    def pid(self) -> Optional[int]:
        """The OS pid on the server's host."""
        return self._inner.pid

    @property
    def returncode(self) -> Optional[int]:
        """The exit code once known."""
        return self._inner.returncode

    @property
    def exited(self) -> Optional[Exited]:
        """How the process ended, once known."""
        return self._inner.exited

    def __iter__(self) -> Iterator[OutputChunk]:
        return _sync(self._inner.__aiter__())

    def events(self) -> Iterator[Event]:
        """Every event in order."""
        return _iterate(self._inner._next_event)

    @property
    def stdout(self) -> Iterator[bytes]:
        """Standard output, chunk by chunk."""
        self._inner._kept.update(("stdout", "stderr"))
        return _iterate(lambda: self._inner._stream_chunk("stdout"))

    @property
    def stderr(self) -> Iterator[bytes]:
        """Standard error, chunk by chunk."""
        self._inner._kept.update(("stdout", "stderr"))
        return _iterate(lambda: self._inner._stream_chunk("stderr"))

    def wait(self, timeout: Optional[float] = None, *, discard_output: bool = False) -> int:
        """Waits for the exit; with ``timeout`` (seconds) raises
        ``TimeoutError`` instead of waiting longer (the process keeps running,
        and its output is kept, as after a cancelled async ``wait``)."""
        future = asyncio.run_coroutine_threadsafe(
            self._inner.wait(discard_output=discard_output), _background_loop()
        )
        try:
            return future.result(timeout)
        except (TimeoutError, concurrent.futures.TimeoutError):
            # Before Python 3.11 the two differ; callers catch TimeoutError.
            future.cancel()
            raise TimeoutError(f"process {self.id} still runs after {timeout} s") from None

    def communicate(self) -> CompletedProcess:
        """All output until the process closes, and its exit code."""
        return _run(self._inner.communicate())

    def write(self, data: Union[bytes, str]) -> str:
        """Writes to stdin."""
        return _run(self._inner.write(data))

    def close_stdin(self) -> str:
        """Closes stdin."""
        return _run(self._inner.close_stdin())

    def resize(self, rows: int, cols: int) -> None:
        """Resizes the PTY."""
        _run(self._inner.resize(rows, cols))

    def signal(self, sig: Union[int, str]) -> None:
        """Sends a signal to the process's group."""
        _run(self._inner.signal(sig))

    def terminate(self) -> str:
        """Kills the process and its tree."""
        return _run(self._inner.terminate())


class Environment:
    """An environment (see :class:`exec_server.Environment`); its methods block."""

    def __init__(self, inner: _environment.Environment) -> None:
        self._inner = inner

    def __repr__(self) -> str:
        return repr(self._inner)

    def __enter__(self) -> "Environment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def local(cls) -> "Environment":
        """This machine, through a server embedded in this process."""
        return cls(_environment.Environment.local())

    @classmethod
    def connect(cls, url: str, *, token: Optional[str] = None, network_policy: Optional[Decide] = None) -> "Environment":
        """A server at ``url``; ``network_policy`` runs on the background loop."""

        async def make() -> _environment.Environment:
            return _environment.Environment.connect(url, token=token, network_policy=network_policy)

        return cls(_run(make()))

    @classmethod
    def remote(cls, registry_url: str, environment_id: str, **options: Any) -> "Environment":
        """An environment behind a registry (see :meth:`exec_server.Environment.remote`)."""
        return cls(_environment.Environment.remote(registry_url, environment_id, **options))

    @property
    def id(self) -> str:
        """The environment's id."""
        return self._inner.id

    @property
    def recoveries(self) -> int:
        """How many times a dropped connection was recovered."""
        return self._inner.recoveries

    @property
    def session_id(self) -> Optional[str]:
        """The session id, once connected."""
        return self._inner.session_id

    @classmethod
    def from_toml(cls, path: PathLike) -> Dict[str, "Environment"]:
        """The environments of an ``environments.toml`` (see
        :meth:`exec_server.Environment.from_toml`)."""

        async def make() -> Dict[str, _environment.Environment]:
            return _environment.Environment.from_toml(path)

        return {k: cls(v) for k, v in _run(make()).items()}

    def start(self, command: Union[Command, str, Sequence[str]]) -> Process:
        """Starts a process."""
        return Process(_run(self._inner.start(command)))

    def run(
        self,
        command: Union[Command, str, Sequence[str]],
        *,
        input: Optional[Union[bytes, str]] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        check: bool = False,
    ) -> CompletedProcess:
        """Runs a command to the end: ``(exit_code, stdout, stderr)``."""
        return _run(self._inner.run(command, input=input, cwd=cwd, env=env, check=check))

    def read_file(self, path: PathLike) -> bytes:
        """A whole file's bytes."""
        return _run(self._inner.read_file(path))

    def read_text(self, path: PathLike, encoding: str = "utf-8") -> str:
        """A whole file as text."""
        return _run(self._inner.read_text(path, encoding))

    def write_file(self, path: PathLike, data: Union[bytes, str]) -> None:
        """Writes a whole file."""
        _run(self._inner.write_file(path, data))

    def metadata(self, path: PathLike) -> Metadata:
        """A path's metadata."""
        return _run(self._inner.metadata(path))

    def exists(self, path: PathLike) -> bool:
        """Whether a path exists."""
        return _run(self._inner.exists(path))

    def list_dir(self, path: PathLike) -> List[DirEntry]:
        """A directory's entries."""
        return _run(self._inner.list_dir(path))

    def mkdir(self, path: PathLike, *, parents: bool = False) -> None:
        """Makes a directory."""
        _run(self._inner.mkdir(path, parents=parents))

    def remove(self, path: PathLike, *, recursive: bool = False, force: bool = False) -> None:
        """Removes a file or tree."""
        _run(self._inner.remove(path, recursive=recursive, force=force))

    def copy(self, src: PathLike, dst: PathLike, *, recursive: bool = False) -> None:
        """Copies on the server."""
        _run(self._inner.copy(src, dst, recursive=recursive))

    def upload(self, local: Union[PathLike, BinaryIO], remote: PathLike) -> int:
        """Uploads a local file."""
        return _run(self._inner.upload(local, remote))

    def download(self, remote: PathLike, local: Union[PathLike, BinaryIO]) -> int:
        """Downloads into a local file."""
        return _run(self._inner.download(remote, local))

    def http_request(
        self,
        method: str,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        body: Optional[Union[bytes, str]] = None,
        timeout: Optional[float] = None,
        follow_redirects: bool = True,
    ) -> HttpResponse:
        """An HTTP request made by the server; the whole response."""
        return _run(
            self._inner.http_request(
                method, url, headers=headers, body=body, timeout=timeout, follow_redirects=follow_redirects
            )
        )

    def http_stream(
        self,
        method: str,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        body: Optional[Union[bytes, str]] = None,
        timeout: Optional[float] = None,
    ) -> Tuple[int, List[Tuple[str, str]], Iterator[bytes]]:
        """An HTTP request made by the server: ``(status, headers, body)``
        with the body an iterator of ``bytes`` as it arrives."""
        r = _run(self._inner.http_stream(method, url, headers=headers, body=body, timeout=timeout))
        return r.status, r.headers, _sync(r.body)

    def watch(self, path: PathLike, *, recursive: bool = False) -> Iterator[Change]:
        """Changes under ``path`` until the watch ends (see
        :meth:`exec_server.Environment.watch`)."""
        return _sync(_run(self._inner.watch(path, recursive=recursive)))

    def drop_connection(self) -> None:
        """Drops the current connection; the next call resumes the session."""
        _run(self._inner.drop_connection())

    def info(self) -> Dict[str, Any]:
        """The server's ``environment/info``."""
        return _run(self._inner.info())

    def close(self) -> None:
        """Closes the connection (see :meth:`exec_server.Environment.close`)."""
        _run(self._inner.close())


def connect(url: str, *, token: Optional[str] = None, network_policy: Optional[Decide] = None) -> Environment:
    """:meth:`Environment.connect`."""
    return Environment.connect(url, token=token, network_policy=network_policy)
