"""``Environment``: where commands run and files live."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, BinaryIO, Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import _native
from ._command import Command
from ._process import CompletedProcess, Process
from .errors import ConfigurationError, ExecServerError, ProcessFailed
from .network import Answer, NetworkRequest, _Policy

__all__ = ["Change", "Environment", "FileWatch", "Metadata", "DirEntry", "HttpResponse", "StreamedHttpResponse", "connect"]

#: Where :meth:`Environment.remote` reads the harness token by default.
TOKEN_ENV = "CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN"

PathLike = Union[str, "os.PathLike[str]"]
Decide = Callable[[NetworkRequest], Union[Answer, Awaitable[Answer]]]


class Metadata(NamedTuple):
    """A path's metadata on the server. Times are milliseconds since the epoch."""

    is_directory: bool
    is_file: bool
    is_symlink: bool
    size: int
    created_at_ms: int
    modified_at_ms: int


class DirEntry(NamedTuple):
    """One entry of :meth:`Environment.list_dir`."""

    name: str
    is_directory: bool
    is_file: bool


class Change(NamedTuple):
    """One change a :class:`FileWatch` reports: ``kind`` is ``"create"``,
    ``"modify"``, ``"remove"``, ``"rename"`` or ``"other"``."""

    kind: str
    paths: List[str]


class FileWatch:
    """A watch made by :meth:`Environment.watch`: an async iterator of
    :class:`Change`. ``ended`` holds why it ended on its own, once it has."""

    def __init__(self, native: _native.FileWatch) -> None:
        self._native = native
        self.ended: Optional[str] = None

    def __aiter__(self) -> "FileWatch":
        return self

    async def __anext__(self) -> Change:
        event = await self._native.next_event()
        if event is None:
            raise StopAsyncIteration
        if event[0] == "ended":
            self.ended = event[1]
            raise StopAsyncIteration
        return Change(event[1], list(event[2]))

    async def close(self) -> None:
        """Removes the watch on the server."""
        await self._native.close()

    async def __aenter__(self) -> "FileWatch":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class HttpResponse(NamedTuple):
    """A whole HTTP response: ``status``, ``headers`` (name, value) pairs
    in order, ``body``."""

    status: int
    headers: List[Tuple[str, str]]
    body: bytes


class StreamedHttpResponse(NamedTuple):
    """An HTTP response whose ``body`` is an async iterator of ``bytes``."""

    status: int
    headers: List[Tuple[str, str]]
    body: AsyncIterator[bytes]


async def _body(stream: Optional[_native.HttpBody]) -> AsyncIterator[bytes]:
    if stream is None:
        return
    while True:
        chunk = await stream.next_chunk()
        if chunk is None:
            return
        yield chunk


@contextlib.contextmanager
def _about(path: Union[PathLike, BinaryIO]) -> Iterator[None]:
    """Names ``path`` in a failure of the call inside (the server's own
    messages about files often do not)."""
    try:
        yield
    except ExecServerError as e:
        if getattr(e, "_call_path", None) is None and isinstance(path, (str, os.PathLike)):
            setattr(e, "_call_path", os.fspath(path))
        raise


def _fileno(f: BinaryIO) -> Optional[int]:
    try:
        return f.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None


def _path(p: PathLike) -> str:
    return os.fspath(p)


class Environment:
    """One exec-server: embedded in this process (:meth:`local`), at a URL
    (:meth:`connect`), or behind a registry (:meth:`remote`).

    Nothing connects until the first call; a dropped connection is recovered
    (the session resumed, every process's output read on from where it
    stopped) without the caller noticing. Use it as an async context manager
    (or call :meth:`close`) to end the session.
    """

    def __init__(self, native: _native.Environment) -> None:
        self._native = native

    def __repr__(self) -> str:
        return f"<Environment {self.id}>"

    async def __aenter__(self) -> "Environment":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @classmethod
    def local(cls) -> "Environment":
        """This machine, through a server embedded in this process."""
        return cls(_native.Environment.local())

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        token: Optional[str] = None,
        network_policy: Optional[Decide] = None,
    ) -> "Environment":
        """A server at ``url`` (``ws://``, ``wss://``, ``unix:///path``), with an
        optional bearer ``token``. ``network_policy``: an ``async def
        decide(request) -> bool`` asked about each destination a managed
        network proxy leaves open (call this inside a running event loop then:
        the policy runs on it). ``decide`` may also be a plain function;
        see :class:`exec_server.NetworkRequest` for what it may answer."""
        policy = _Policy(network_policy) if network_policy is not None else None
        return cls(_native.Environment.connect(url, token, policy))

    @classmethod
    def remote(
        cls,
        registry_url: str,
        environment_id: str,
        *,
        token_env: str = TOKEN_ENV,
        token_file: Optional[PathLike] = None,
        account_id: Optional[str] = None,
    ) -> "Environment":
        """The environment ``environment_id`` registered at ``registry_url``,
        reached through the registry's relay, end-to-end encrypted.

        The harness token is read from the file ``token_file`` when given,
        else from the environment variable ``token_env``: never passed as an
        argument, so it stays out of logs and tracebacks."""
        if token_file is not None:
            try:
                token = Path(token_file).read_text().strip()
            except OSError as e:
                raise ConfigurationError(f"cannot read the token file {os.fspath(token_file)}: {e}") from None
        else:
            token = os.environ.get(token_env, "").strip()
        if not token:
            where = f"file {os.fspath(token_file)}" if token_file is not None else f"${token_env}"
            raise ConfigurationError(f"no harness token in {where}")
        return cls(_native.Environment.remote(registry_url, environment_id, token, account_id))

    @property
    def id(self) -> str:
        """``local``, the URL, or the environment id."""
        return self._native.id

    @property
    def session_id(self) -> Optional[str]:
        """The session id, once connected."""
        return self._native.session_id()

    @property
    def recoveries(self) -> int:
        """How many times a dropped connection was recovered."""
        return self._native.recoveries()

    async def start(self, command: Union[Command, str, Sequence[str]]) -> Process:
        """Starts ``command`` (a :class:`Command`, or an argv) and returns its
        :class:`Process` as soon as it runs."""
        cmd = command if isinstance(command, Command) else Command(command)
        native = await self._native.start(
            list(cmd.argv),
            cmd.working_dir,
            dict(cmd.environment),
            cmd.inherits_env,
            cmd.pty_size,
            cmd.stdin_piped,
            process_id=cmd.process_id,
            timeout=cmd.wall_timeout,
            idle_timeout=cmd.idle,
            max_output=cmd.output_cap,
            memory=cmd.memory_bytes,
            max_tasks=cmd.tasks,
            cpu_percent=cmd.cpu,
            kill_on_drop=cmd.kill_on_drop,
            network_proxy=json.dumps(cmd.proxy_config) if cmd.proxy_config is not None else None,
        )
        return Process(native)

    async def run(
        self,
        command: Union[Command, str, Sequence[str]],
        *,
        input: Optional[Union[bytes, str]] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        check: bool = False,
    ) -> CompletedProcess:
        """Runs ``command`` to the end, like ``subprocess.run``: returns
        ``(exit_code, stdout, stderr)``. ``input`` is written to its stdin
        (then closed); ``check`` raises :class:`ProcessFailed` on a non-zero
        exit."""
        cmd = command if isinstance(command, Command) else Command(command)
        if cwd is not None:
            cmd = cmd.cwd(cwd)
        if env is not None:
            cmd = cmd.envs(env)
        if input is not None:
            cmd = cmd.stdin()
        proc = await self.start(cmd)
        if input is not None:
            await proc.write(input)
            await proc.close_stdin()
        done = await proc.communicate()
        if check and done.exit_code != 0:
            raise ProcessFailed(list(cmd.argv), done.exit_code, done.stdout, done.stderr)
        return done

    async def read_file(self, path: PathLike) -> bytes:
        """A whole file's bytes."""
        with _about(path):
            return await self._native.read_file(_path(path))

    async def read_text(self, path: PathLike, encoding: str = "utf-8") -> str:
        """A whole file as text."""
        return (await self.read_file(path)).decode(encoding)

    async def write_file(self, path: PathLike, data: Union[bytes, bytearray, memoryview, str]) -> None:
        """Writes a whole file (``str`` as UTF-8); it is replaced atomically."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        with _about(path):
            await self._native.write_file(_path(path), raw)

    async def metadata(self, path: PathLike) -> Metadata:
        """A path's :class:`Metadata`."""
        with _about(path):
            m = json.loads(await self._native.metadata(_path(path)))
        return Metadata(
            m["isDirectory"],
            m["isFile"],
            m.get("isSymlink", False),
            m.get("size", 0),
            m.get("createdAtMs", 0),
            m.get("modifiedAtMs", 0),
        )

    async def exists(self, path: PathLike) -> bool:
        """Whether ``path`` exists on the server."""
        from .errors import NotFound

        try:
            await self.metadata(path)
        except NotFound:
            return False
        return True

    async def list_dir(self, path: PathLike) -> List[DirEntry]:
        """A directory's entries."""
        with _about(path):
            entries = json.loads(await self._native.list_dir(_path(path)))
        return [DirEntry(e["fileName"], e["isDirectory"], e["isFile"]) for e in entries]

    async def mkdir(self, path: PathLike, *, parents: bool = False) -> None:
        """Makes a directory (and its missing parents with ``parents``)."""
        with _about(path):
            await self._native.mkdir(_path(path), parents)

    async def remove(self, path: PathLike, *, recursive: bool = False, force: bool = False) -> None:
        """Removes a file, or a tree with ``recursive``; ``force`` ignores a
        missing path."""
        with _about(path):
            await self._native.remove(_path(path), recursive, force)

    async def copy(self, src: PathLike, dst: PathLike, *, recursive: bool = False) -> None:
        """Copies a file, or a tree with ``recursive``, on the server."""
        with _about(src):
            await self._native.copy(_path(src), _path(dst), recursive)

    async def upload(self, local: Union[PathLike, BinaryIO], remote: PathLike) -> int:
        """Copies ``local`` to ``remote`` in blocks (no size limit); returns
        the bytes sent. ``local`` is a path or a binary file object: one with
        a file descriptor is read from its start, in blocks; any other
        (``io.BytesIO``...) is read whole."""
        if isinstance(local, (str, os.PathLike)):
            with _about(local):
                return await self._native.upload(_path(local), _path(remote))
        fd = _fileno(local)
        if fd is not None:
            return await self._native.upload(f"/proc/self/fd/{fd}", _path(remote))
        data = local.read()
        await self.write_file(remote, data)
        return len(data)

    async def download(self, remote: PathLike, local: Union[PathLike, BinaryIO]) -> int:
        """Copies ``remote`` into ``local`` in blocks; returns the bytes
        written. ``local`` is a path (created or truncated) or a binary file
        object: one with a file descriptor is written from its start, in
        blocks; any other receives the whole file with one ``write``."""
        if isinstance(local, (str, os.PathLike)):
            with _about(remote):
                return await self._native.download(_path(remote), _path(local))
        fd = _fileno(local)
        if fd is not None:
            local.flush()
            return await self._native.download(_path(remote), f"/proc/self/fd/{fd}")
        data = await self.read_file(remote)
        local.write(data)
        return len(data)

    def _http(
        self,
        method: str,
        url: str,
        headers: Optional[Mapping[str, str]],
        body: Optional[Union[bytes, str]],
        timeout: Optional[float],
        stream: bool,
        follow_redirects: bool,
    ) -> Awaitable[Tuple[int, List[Tuple[str, str]], bytes, Optional[_native.HttpBody]]]:
        raw = body.encode() if isinstance(body, str) else body
        return self._native.http_request(
            method, url, list((headers or {}).items()), raw, timeout, stream, follow_redirects
        )

    async def http_request(
        self,
        method: str,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        body: Optional[Union[bytes, str]] = None,
        timeout: Optional[float] = None,
        follow_redirects: bool = True,
    ) -> "HttpResponse":
        """An HTTP request made by the server (``http/request``): from its
        network, with its credentials; returns the whole response."""
        status, hdrs, data, _ = await self._http(method, url, headers, body, timeout, False, follow_redirects)
        return HttpResponse(status, hdrs, data)

    async def http_stream(
        self,
        method: str,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        body: Optional[Union[bytes, str]] = None,
        timeout: Optional[float] = None,
        follow_redirects: bool = True,
    ) -> "StreamedHttpResponse":
        """As :meth:`http_request`, but the body is read as it arrives:
        ``async for chunk in (await env.http_stream("GET", url)).body``."""
        status, hdrs, _, stream = await self._http(method, url, headers, body, timeout, True, follow_redirects)
        return StreamedHttpResponse(status, hdrs, _body(stream))

    async def watch(self, path: PathLike, *, recursive: bool = False) -> "FileWatch":
        """Watches ``path`` (a directory's whole tree with ``recursive``):
        ``async for change in await env.watch(d)`` yields :class:`Change`\ s
        until the watch ends (its directory went away) or is closed. A
        ``Change("other", [path])`` for the watched path itself means changes
        may have been missed (after a dropped connection): look again. Use it
        as an async context manager to remove the watch when done."""
        with _about(path):
            return FileWatch(await self._native.watch(_path(path), recursive))

    async def info(self) -> Dict[str, Any]:
        """The server's ``environment/info`` (capabilities, platform...)."""
        info: Dict[str, Any] = json.loads(await self._native.info())
        return info

    async def drop_connection(self) -> None:
        """Drops the current connection; the next call resumes the session
        (a test of recovery, or a nudge after a network change)."""
        await self._native.drop_connection()

    async def close(self) -> None:
        """Closes the connection. The session is detached: the server ends
        it, and kills its processes, after its detached-session TTL (30 s by
        default); :meth:`Process.terminate` what must end now."""
        await self._native.close()

    @classmethod
    def from_toml(cls, path: PathLike) -> Dict[str, "Environment"]:
        """The environments of an ``environments.toml`` file (the Codex CLI's
        format), by id; the default one is also under the key ``""``."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise ConfigurationError(f"cannot read {p}: {e}") from None
        pairs, default = _native.Environment.from_toml(text, str(p.parent))
        out = {i: cls(n) for i, n in pairs}
        if default is not None and default in out:
            out[""] = out[default]
        return out


def connect(
    url: str,
    *,
    token: Optional[str] = None,
    network_policy: Optional[Decide] = None,
) -> Environment:
    """:meth:`Environment.connect`."""
    return Environment.connect(url, token=token, network_policy=network_policy)
