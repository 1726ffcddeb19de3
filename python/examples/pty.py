"""Drive an interactive program on a pseudo-terminal."""

import asyncio

from exec_server import Command, Environment


async def main() -> None:
    async with Environment.local() as env:
        proc = await env.start(Command(["sh", "-c", "read name; echo hello $name; stty size"]).pty(rows=24, cols=80))
        await proc.resize(rows=50, cols=132)
        await proc.write("world\n")
        screen = b"".join([data async for data in proc.stdout])
        print(screen.decode(errors="replace"))
        print("exit", await proc.wait())


if __name__ == "__main__":
    asyncio.run(main())
