"""A connection cut mid-stream loses nothing: the Rust client resumes the
session and reads on from the last chunk it had."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Tuple

from exec_server import Command, Environment

from .conftest import CuttingProxy


async def test_a_stream_through_cut_connections_is_byte_identical(
    cutting_proxy: Tuple[CuttingProxy, str],
) -> None:
    proxy, url = cutting_proxy
    # Far more than the client's queue (16 MiB) and the server's window hold,
    # so the process still runs, its output partly unread, at each cut.
    expected = subprocess.run(["seq", "1", "6000000"], capture_output=True, check=True).stdout
    async with Environment.connect(url) as env:
        proc = await env.start(Command(["seq", "1", "6000000"]))
        got = bytearray()
        cut_at = [2 << 20, 4 << 20, 6 << 20]
        async for data in proc.stdout:
            got += data
            if cut_at and len(got) >= cut_at[0]:
                cut_at.pop(0)
                proxy.cut()
        assert await proc.wait() == 0
        assert bytes(got) == expected
        assert proxy.cuts == 3
        assert env.recoveries >= 1


async def test_stdin_retried_after_a_cut_is_applied_once(
    cutting_proxy: Tuple[CuttingProxy, str],
) -> None:
    proxy, url = cutting_proxy
    async with Environment.connect(url) as env:
        proc = await env.start(Command("cat").stdin())
        for i in range(20):
            await proc.write(b"line %d\n" % i)
            if i % 5 == 4:
                proxy.cut()
        await proc.close_stdin()
        done = await proc.communicate()
        assert done.stdout == b"".join(b"line %d\n" % i for i in range(20))


async def test_calls_made_while_reading_a_busy_stream_survive_drops() -> None:
    # A consumer that makes calls between chunks while the connection drops:
    # the recovery's catch-up waits for room in the stream's queue, which only
    # this consumer makes; it must not hold up the consumer's own calls.
    async with Environment.local() as env:
        proc = await env.start(["seq", "1", "3000000"])
        got = bytearray()
        n = 0
        async for data in proc.stdout:
            got += data
            n += 1
            if n % 50 == 0:
                await env.drop_connection()
                await asyncio.wait_for(env.metadata("/tmp"), 20)
        assert await proc.wait() == 0
        expected = subprocess.run(["seq", "1", "3000000"], capture_output=True, check=True).stdout
        assert bytes(got) == expected
        assert env.recoveries >= 2
