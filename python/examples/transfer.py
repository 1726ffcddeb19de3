"""Upload a file, work on it remotely, download the result."""

import asyncio
import tempfile
from pathlib import Path

from exec_server import Environment


async def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        local = Path(d) / "words.txt"
        local.write_text("pear\napple\nfig\n")
        async with Environment.local() as env:
            remote_dir = Path(d) / "remote"
            await env.mkdir(remote_dir, parents=True)
            await env.upload(local, remote_dir / "words.txt")
            done = await env.run(["sh", "-c", "sort words.txt > sorted.txt"], cwd=str(remote_dir), check=True)
            await env.download(remote_dir / "sorted.txt", Path(d) / "sorted.txt")
            print((Path(d) / "sorted.txt").read_text(), end="")
            print("listing:", [e.name for e in await env.list_dir(remote_dir)], "exit", done.exit_code)


if __name__ == "__main__":
    asyncio.run(main())
