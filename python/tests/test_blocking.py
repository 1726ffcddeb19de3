"""The blocking twin, from plain code and from inside a running event loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from exec_server import Command, errors
from exec_server.blocking import Environment

from .conftest import Server


def test_blocking_run_stream_files(scratch: Path) -> None:
    with Environment.local() as env:
        assert env.run(["sh", "-c", "printf x; exit 2"]) == (2, b"x", b"")
        proc = env.start(["sh", "-c", "for i in 1 2 3; do echo $i; done"])
        assert b"".join(proc.stdout) == b"1\n2\n3\n"
        assert proc.wait() == 0
        proc = env.start(Command("cat").stdin())
        proc.write(b"abc")
        proc.close_stdin()
        assert proc.communicate().stdout == b"abc"
        env.write_file(scratch / "f", b"data")
        assert env.read_file(scratch / "f") == b"data"
        assert env.read_text(scratch / "f") == "data"
        assert env.session_id
        proc = env.start(["sh", "-c", "echo a; sleep 0.4; echo b"])
        with pytest.raises(TimeoutError):
            proc.wait(timeout=0.1)
        assert proc.communicate() == (0, b"a\nb\n", b"")
        assert proc.exited is not None and proc.exited.exit_code == 0
        with pytest.raises(errors.ProgramNotFound):
            env.run(["/no/such/program"])
        proc = env.start(["sleep", "30"])
        with pytest.raises(TimeoutError):
            proc.wait(timeout=0.2)
        assert proc.terminate() == "killedRunning"


def test_blocking_connect(server: Server) -> None:
    with Environment.connect(server.url) as env:
        assert env.run("true").exit_code == 0


async def test_blocking_works_inside_a_running_loop() -> None:
    # As in a notebook: the calling thread already runs an event loop.
    def work() -> int:
        with Environment.local() as env:
            return env.run(["sh", "-c", "exit 9"]).exit_code

    assert work() == 9
    assert await asyncio.sleep(0, result=1) == 1
