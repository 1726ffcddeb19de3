"""exec-server for Python: run commands, stream their output and move files
on this machine or a remote one, through the Rust client of exec-server.

Async first::

    import asyncio
    from exec_server import Environment, Command

    async def main() -> None:
        async with Environment.local() as env:
            code, out, err = await env.run(["sh", "-c", "echo hi; exit 3"])
            proc = await env.start(Command(["make", "test"]).cwd("/src"))
            async for data in proc.stdout:
                print(data.decode(), end="")
            print("exit", await proc.wait())

    asyncio.run(main())

A blocking twin for scripts and notebooks is :mod:`exec_server.blocking`.
Errors are :class:`exec_server.errors.ExecServerError` and its subclasses.
"""

from . import errors
from ._command import Command, managed_network
from ._environment import (
    Change,
    DirEntry,
    Environment,
    FileWatch,
    HttpResponse,
    Metadata,
    StreamedHttpResponse,
    connect,
)
from ._process import CompletedProcess, Exited, OutputChunk, Process
from .errors import ExecServerError
from .network import NetworkRequest

__all__ = [
    "Change",
    "Command",
    "CompletedProcess",
    "DirEntry",
    "Environment",
    "ExecServerError",
    "Exited",
    "FileWatch",
    "HttpResponse",
    "Metadata",
    "NetworkRequest",
    "OutputChunk",
    "Process",
    "StreamedHttpResponse",
    "connect",
    "managed_network",
    "errors",
]

import atexit as _atexit

from ._native import __version__, quiesce as _quiesce  # noqa: E402

_atexit.register(_quiesce)
