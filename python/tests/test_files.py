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


async def test_file_objects_as_sources_and_sinks(scratch: Path) -> None:
    import io

    data = os.urandom(2 * 1024 * 1024 + 5)
    async with Environment.local() as env:
        with open(scratch / "src.bin", "wb+") as f:
            f.write(data)
            f.seek(100)  # read from the start whatever the position
            assert await env.upload(f, scratch / "up.bin") == len(data)
        assert (scratch / "up.bin").read_bytes() == data
        assert await env.upload(io.BytesIO(b"small"), scratch / "small.bin") == 5
        assert (scratch / "small.bin").read_bytes() == b"small"
        with open(scratch / "down.bin", "wb") as f:
            assert await env.download(scratch / "up.bin", f) == len(data)
        assert (scratch / "down.bin").read_bytes() == data
        sink = io.BytesIO()
        assert await env.download(scratch / "small.bin", sink) == 5
        assert sink.getvalue() == b"small"


async def test_environments_toml(server: Server, scratch: Path) -> None:
    from .conftest import BIN

    (scratch / "environments.toml").write_text(
        f"""
default = "srv"
[[environments]]
id = "srv"
url = "{server.url}"
[[environments]]
id = "piped"
program = "{BIN}"
args = ["--listen", "stdio"]
"""
    )
    envs = Environment.from_toml(scratch / "environments.toml")
    assert sorted(envs) == ["", "local", "piped", "srv"]
    assert envs[""] is envs["srv"]
    for name in ("local", "piped", "srv"):
        async with envs[name] as env:
            done = await env.run(["sh", "-c", f"printf {name}"])
            assert done.stdout == name.encode()
    (scratch / "bad.toml").write_text("[[environments]]\nid = 'x'\nnonsense = 1\n")
    with pytest.raises(errors.ConfigurationError):
        Environment.from_toml(scratch / "bad.toml")


async def test_a_watch_yields_changes_until_its_directory_goes(scratch: Path) -> None:
    import asyncio

    d = scratch / "watched" / "inner"
    d.mkdir(parents=True)
    async with Environment.local() as env:
        watch = await env.watch(d)
        (d / "a.txt").write_text("x")
        kinds = []
        async def collect() -> None:
            async for change in watch:
                kinds.append((change.kind, [Path(p).name for p in change.paths]))
                if ("create", ["a.txt"]) in kinds and not (scratch / "watched").exists():
                    pass
        task = asyncio.ensure_future(collect())
        for _ in range(100):
            if ("create", ["a.txt"]) in kinds:
                break
            await asyncio.sleep(0.05)
        assert ("create", ["a.txt"]) in kinds, kinds
        import shutil

        shutil.rmtree(scratch / "watched")
        await asyncio.wait_for(task, 10)
        assert watch.ended, "the watch says why it ended"
        async with await env.watch(scratch) as w2:
            assert isinstance(w2.ended, type(None))
