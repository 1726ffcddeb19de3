"""Failures arrive as the exception classes of ``exec_server.errors``."""

from __future__ import annotations

import os
import socket
from typing import Tuple

import pytest

from exec_server import Command, Environment, errors

from .conftest import Server


async def test_a_missing_program_names_its_path_and_code() -> None:
    async with Environment.local() as env:
        with pytest.raises(errors.ProgramNotFound) as caught:
            await env.run(["/no/such/program"])
        e = caught.value
        assert isinstance(e, errors.ExecServerError)
        assert e.code == -32603
        assert e.path == "/no/such/program"
        assert e.errno == 2
        assert e.data is not None and e.data["kind"] == "programNotFound"
        with pytest.raises(errors.CwdNotFound):
            await env.run(Command("true").cwd("/no/such/dir"))
        with pytest.raises(errors.NotFound) as missing:
            await env.read_file("/no/such/file")
        assert missing.value.path == "/no/such/file"
        assert "/no/such/file" in str(missing.value)
        with pytest.raises(ValueError):
            await env.read_file("relative/path")
        with pytest.raises(ValueError):
            Command([])


async def test_a_wrong_or_missing_token_is_unauthorized(token_server: Tuple[Server, str]) -> None:
    server, token = token_server
    async with Environment.connect(server.url, token=token) as env:
        assert (await env.run("true")).exit_code == 0
    for wrong in (None, "not-the-token"):
        env = Environment.connect(server.url, token=wrong)
        with pytest.raises(errors.Unauthorized) as caught:
            await env.run("true")
        assert isinstance(caught.value, errors.ConnectionFailed)
        assert "not-the-token" not in str(caught.value)


async def test_nothing_listening_is_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = Environment.connect(f"ws://127.0.0.1:{port}")
    with pytest.raises(errors.ConnectionRefused):
        await env.run("true")


def test_bad_urls_and_tokens_are_configuration_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(errors.ConfigurationError):
        Environment.connect("http://127.0.0.1:1")
    monkeypatch.delenv("CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN", raising=False)
    with pytest.raises(errors.ConfigurationError):
        Environment.remote("http://127.0.0.1:1", "box")


async def test_check_raises_process_failed() -> None:
    async with Environment.local() as env:
        with pytest.raises(errors.ProcessFailed) as caught:
            await env.run(["sh", "-c", "echo no >&2; exit 4"], check=True)
        assert (caught.value.exit_code, caught.value.stderr) == (4, b"no\n")


async def test_file_system_failures_have_their_own_classes(scratch: os.PathLike) -> None:
    from pathlib import Path

    d = Path(scratch)
    (d / "file").write_text("x")
    (d / "full").mkdir()
    (d / "full" / "inner").write_text("y")
    async with Environment.local() as env:
        with pytest.raises(errors.NotADirectory):
            await env.list_dir(d / "file")
        with pytest.raises(errors.AlreadyExists):
            await env.mkdir(d / "full")
        with pytest.raises(errors.DirectoryNotEmpty) as caught:
            await env.remove(d / "full")
        assert caught.value.path == str(d / "full")


async def test_argument_mistakes_are_caught_here(scratch: os.PathLike) -> None:
    from pathlib import Path

    async with Environment.local() as env:
        done = await env.run(Command(["pwd"]).cwd(Path(scratch)))
        assert done.stdout.decode().strip() == os.fspath(scratch)
        proc = await env.start(Command("cat").stdin())
        with pytest.raises(TypeError):
            await proc.write(5)  # type: ignore[arg-type]
        await proc.close_stdin()
        assert await proc.wait() == 0
