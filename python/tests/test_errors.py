"""Failures arrive as the exception classes of ``exec_server.errors``."""

from __future__ import annotations

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
        assert errors.NotADirectory is errors.CwdNotFound
        with pytest.raises(errors.NotFound):
            await env.read_file("/no/such/file")
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
    with pytest.raises(errors.ConnectionFailed):
        Environment.connect("http://127.0.0.1:1")
    monkeypatch.delenv("CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN", raising=False)
    with pytest.raises(errors.ConfigurationError):
        Environment.remote("http://127.0.0.1:1", "box")


async def test_check_raises_process_failed() -> None:
    async with Environment.local() as env:
        with pytest.raises(errors.ProcessFailed) as caught:
            await env.run(["sh", "-c", "echo no >&2; exit 4"], check=True)
        assert (caught.value.exit_code, caught.value.stderr) == (4, b"no\n")
