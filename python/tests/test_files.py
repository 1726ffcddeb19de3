"""Files, checked on this host (the servers run here)."""

from __future__ import annotations

import os
from pathlib import Path

from exec_server import Environment, errors

import pytest

from .conftest import Server


@pytest.mark.parametrize("where", ["embedded", "spawned"])
async def test_whole_files_directories_and_copies(where: str, server: Server, scratch: Path) -> None:
    env = Environment.local() if where == "embedded" else Environment.connect(server.url)
    async with env:
        f = scratch / "a.txt"
        await env.write_file(f, b"hello\x00world")
        assert f.read_bytes() == b"hello\x00world"
        assert await env.read_file(f) == b"hello\x00world"
        await env.write_file(str(f), "text")
        assert await env.read_text(f) == "text"
        meta = await env.metadata(f)
        assert (meta.is_file, meta.is_directory, meta.size) == (True, False, 4)
        await env.mkdir(scratch / "d" / "e", parents=True)
        assert (scratch / "d" / "e").is_dir()
        await env.copy(f, scratch / "d" / "e" / "b.txt")
        await env.copy(scratch / "d", scratch / "d2", recursive=True)
        assert (scratch / "d2" / "e" / "b.txt").read_text() == "text"
        names = sorted((e.name, e.is_directory) for e in await env.list_dir(scratch))
        assert names == [("a.txt", False), ("d", True), ("d2", True)]
        assert await env.exists(scratch / "d2")
        await env.remove(scratch / "d2", recursive=True)
        assert not (scratch / "d2").exists()
        assert not await env.exists(scratch / "d2")
        await env.remove(scratch / "gone", force=True)
        with pytest.raises(errors.NotFound):
            await env.remove(scratch / "gone")


async def test_upload_and_download_in_blocks(scratch: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    (scratch / "local.bin").write_bytes(data)
    async with Environment.local() as env:
        sent = await env.upload(scratch / "local.bin", scratch / "remote.bin")
        assert sent == len(data)
        assert (scratch / "remote.bin").read_bytes() == data
        got = await env.download(scratch / "remote.bin", scratch / "back.bin")
        assert got == len(data)
        assert (scratch / "back.bin").read_bytes() == data
        with pytest.raises(errors.LocalError):
            await env.upload(scratch / "missing.bin", scratch / "x")
