"""Processes through the embedded server and a spawned ``exec-server``."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import AsyncIterator

import pytest

from exec_server import Command, Environment, Exited, OutputChunk

from .conftest import Server


@pytest.fixture(params=["embedded", "spawned"])
async def env(request: pytest.FixtureRequest, server: Server) -> AsyncIterator[Environment]:
    e = Environment.local() if request.param == "embedded" else Environment.connect(server.url)
    try:
        yield e
    finally:
        await e.close()


async def test_run_returns_exit_code_and_both_streams(env: Environment) -> None:
    done = await env.run(["sh", "-c", "printf out; printf err >&2; exit 3"])
    assert done == (3, b"out", b"err")
    code, out, err = done
    assert (code, done.returncode) == (3, 3)
    assert (await env.run("true")).exit_code == 0


async def test_run_with_input_cwd_and_env(env: Environment, scratch: os.PathLike) -> None:
    done = await env.run(
        ["sh", "-c", 'cat; printf "|%s|%s" "$PWD" "$GREETING"'],
        input=b"from stdin",
        cwd=os.fspath(scratch),
        env={"GREETING": "hello"},
    )
    assert done.stdout == f"from stdin|{os.fspath(scratch)}|hello".encode()


async def test_the_environment_is_clean_unless_inherited(env: Environment) -> None:
    os.environ["PY_SDK_MARKER"] = "from-the-host"
    clean = await env.run(["sh", "-c", "printf %s \"${PY_SDK_MARKER-unset}\""])
    assert clean.stdout == b"unset"
    inherited = await env.run(Command(["sh", "-c", "printf %s \"$PATH\""]).inherit_env())
    assert inherited.stdout, "an inherited environment has a PATH"


async def test_stdout_and_stderr_iterate_separately_without_loss(env: Environment) -> None:
    proc = await env.start(["sh", "-c", "for i in $(seq 1 2000); do echo o$i; echo e$i >&2; done"])
    out = b"".join([d async for d in proc.stdout])
    err = b"".join([d async for d in proc.stderr])
    assert out == b"".join(b"o%d\n" % i for i in range(1, 2001))
    assert err == b"".join(b"e%d\n" % i for i in range(1, 2001))
    assert await proc.wait() == 0


async def test_events_come_in_order_and_end_with_the_exit(env: Environment) -> None:
    proc = await env.start(["sh", "-c", "echo a; echo b >&2; exit 5"])
    events = [e async for e in proc.events()]
    chunks = [e for e in events if isinstance(e, OutputChunk)]
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"a\n"
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"b\n"
    exits = [e for e in events if isinstance(e, Exited)]
    assert exits == [Exited(5, None, None)]
    assert proc.returncode == 5


async def test_stdin_is_written_once_and_closed(env: Environment) -> None:
    proc = await env.start(Command("cat").stdin())
    assert await proc.write(b"one ") == "accepted"
    assert await proc.write("two") == "accepted"
    await proc.close_stdin()
    done = await proc.communicate()
    assert done == (0, b"one two", b"")
    proc = await env.start(Command(["sh", "-c", "cat; sleep 30"]).stdin())
    await proc.close_stdin()
    assert await proc.write(b"late") == "stdinClosed"
    assert await proc.terminate() == "killedRunning"


async def test_a_pty_echoes_and_resizes(env: Environment) -> None:
    proc = await env.start(Command(["sh", "-c", "stty size; read x; stty size; echo got:$x"]).pty(rows=30, cols=100))
    seen = b""
    async for data in proc.stdout:
        seen += data
        if b"30 100" in seen:
            break
    await proc.resize(rows=40, cols=120)
    await proc.write(b"typed\n")
    rest = b"".join([d async for d in proc.stdout])
    assert b"40 120" in rest and b"got:typed" in rest, rest
    assert await proc.wait() == 0


async def test_signals_and_terminate(env: Environment) -> None:
    proc = await env.start(["sh", "-c", "trap 'exit 42' USR1; while true; do sleep 0.05; done"])
    await asyncio.sleep(0.3)  # the trap must be set before the signal
    await proc.signal(signal.SIGUSR1)
    assert await proc.wait() == 42
    proc = await env.start(["sleep", "60"])
    assert await proc.terminate() == "killedRunning"
    assert await proc.wait() == 128 + signal.SIGKILL
    with pytest.raises(ValueError):
        await proc.signal(signal.SIGSEGV)


async def test_cancelling_wait_neither_kills_nor_loses_output(env: Environment) -> None:
    proc = await env.start(["sh", "-c", "echo before; sleep 1; echo after"])
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(proc.communicate(), 0.3)
    # Still running: only terminate() ends it. And nothing was lost.
    done = await proc.communicate()
    assert done == (0, b"before\nafter\n", b"")
    proc = await env.start(["sh", "-c", "echo early; sleep 0.5; echo late"])
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(proc.wait(), 0.2)
    assert await proc.wait() == 0
    assert await proc.communicate() == (0, b"early\nlate\n", b"")
    proc = await env.start(["sleep", "30"])
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(proc.wait(), 0.2)
    assert await proc.terminate() == "killedRunning"


async def test_limits_end_the_process(env: Environment) -> None:
    proc = await env.start(Command(["sleep", "30"]).timeout(0.3))
    code = await proc.wait()
    assert code != 0
    assert proc.exited is not None and proc.exited.limit == "wallTimeout"
