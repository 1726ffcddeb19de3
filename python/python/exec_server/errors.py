"""The exceptions of ``exec_server``: one hierarchy under :class:`ExecServerError`.

Each carries what the server said: ``code`` (the JSON-RPC code, or ``None``
for failures that are not the server's answer), ``data`` (the server's
structured error data, decoded: for example ``{"kind": "programNotFound",
"path": "/bin/nope", "errno": 2}``) and ``kind`` (the Rust client's
``ErrorKind`` name). Catch the class to branch on the kind of failure; never
match the message text.
"""

from __future__ import annotations

import json
from typing import Any, Optional

__all__ = [
    "ExecServerError",
    "ProgramNotFound",
    "NotExecutable",
    "CwdNotFound",
    "NotADirectory",
    "IsADirectory",
    "AlreadyExists",
    "DirectoryNotEmpty",
    "NotFound",
    "PermissionDenied",
    "InvalidRequest",
    "InvalidParams",
    "ConnectionFailed",
    "ConnectionRefused",
    "Unauthorized",
    "SessionLost",
    "EventsLost",
    "TimedOut",
    "ConfigurationError",
    "LocalError",
    "ProcessFailed",
]


class ExecServerError(Exception):
    """Any failure of an exec-server call.

    Attributes:
        message: what happened, for people.
        code: the server's JSON-RPC error code, when the server answered
            with an error; else ``None``.
        data: the server's structured error data (a dict), when it sent
            any; else ``None``.
        kind: the failure's kind, as the Rust client names it
            (``ProgramNotFound``, ``RecoveryFailed``, ...).
    """

    def __init__(
        self,
        message: str,
        code: Optional[int] = None,
        data: Optional[str] = None,
        kind: str = "Other",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.data: Optional[Any] = json.loads(data) if data else None
        self.kind = kind

    @property
    def path(self) -> Optional[str]:
        """The path the error is about: the one the server's error names, else
        the one the failed call was given."""
        if isinstance(self.data, dict):
            p = self.data.get("path")
            if isinstance(p, str):
                return p
        return getattr(self, "_call_path", None)

    def __str__(self) -> str:
        given = getattr(self, "_call_path", None)
        if given is not None and given not in self.message:
            return f"{self.message} (path {given})"
        return self.message

    @property
    def errno(self) -> Optional[int]:
        """The OS error number the server reported, if any."""
        if isinstance(self.data, dict):
            n = self.data.get("errno")
            return n if isinstance(n, int) else None
        return None


class ProgramNotFound(ExecServerError):
    """``start``: the program does not exist (in ``PATH``, or at the path given)."""


class NotExecutable(ExecServerError):
    """``start``: the program exists but cannot be executed."""


class CwdNotFound(ExecServerError):
    """``start``: the working directory does not exist or is not a directory."""


class NotADirectory(ExecServerError):
    """A path used as a directory is not one (ENOTDIR): ``list_dir`` of a file."""


class IsADirectory(ExecServerError):
    """A path used as a file is a directory (EISDIR)."""


class AlreadyExists(ExecServerError):
    """The path (or process id) already exists (EEXIST): ``mkdir`` of an existing directory."""


class DirectoryNotEmpty(ExecServerError):
    """A directory to remove is not empty (ENOTEMPTY): ``remove`` without ``recursive``."""


class NotFound(ExecServerError):
    """A file, directory or handle does not exist (code -32004)."""


class PermissionDenied(ExecServerError):
    """The OS or a sandbox policy refused."""


class InvalidRequest(ExecServerError):
    """The request does not apply: an unknown or taken id, a reached limit (-32600)."""


class InvalidParams(ExecServerError):
    """Malformed or refused parameters (-32602)."""


class ConnectionFailed(ExecServerError):
    """The connection could not be made or ended for good."""


class ConnectionRefused(ConnectionFailed):
    """Nothing listens at the server's address."""


class Unauthorized(ConnectionFailed):
    """The server refused the connection for want of a valid token (HTTP 401)."""


class SessionLost(ConnectionFailed):
    """The connection ended and the session could not be resumed."""


class EventsLost(ExecServerError):
    """A process's output was lost while the connection was down."""


class TimedOut(ExecServerError):
    """A connect attempt or a call did not finish in time."""


class ConfigurationError(ExecServerError):
    """A bad URL, registry address, token or ``environments.toml``."""


class LocalError(ExecServerError):
    """A local failure: the embedded server cannot start, a local file of a transfer."""


class ProcessFailed(ExecServerError):
    """``run(..., check=True)``: the command exited with a non-zero status.

    Attributes:
        exit_code: the status (128+N for signal N).
        stdout: what it wrote to standard output.
        stderr: what it wrote to standard error.
    """

    def __init__(self, argv: "list[str]", exit_code: int, stdout: bytes, stderr: bytes) -> None:
        super().__init__(f"{argv!r} exited with {exit_code}", kind="ProcessFailed")
        self.argv = argv
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr


_BY_ERRNO = {20: NotADirectory, 21: IsADirectory, 17: AlreadyExists, 39: DirectoryNotEmpty}


def _make(
    class_name: str,
    message: str,
    code: Optional[int] = None,
    data: Optional[str] = None,
    kind: str = "Other",
) -> ExecServerError:
    """The exception the native client raises: the class its kind names,
    refined by the OS error number when the kind alone says little."""
    cls = globals().get(class_name, ExecServerError)
    if not (isinstance(cls, type) and issubclass(cls, ExecServerError)):
        cls = ExecServerError
    made = cls(message, code, data, kind)
    if cls in (ExecServerError, InvalidRequest, PermissionDenied) and made.errno in _BY_ERRNO:
        refined: ExecServerError = _BY_ERRNO[made.errno](message, code, data, kind)
        return refined
    return made
