"""Stream a long-running command's output as it is written, with a time limit."""

import asyncio
import sys

from exec_server import Command, Environment


async def main() -> None:
    async with Environment.local() as env:
        cmd = Command(["sh", "-c", "for i in 1 2 3; do echo step $i; sleep 0.2; done"]).timeout(30)
        proc = await env.start(cmd)
        async for data in proc.stdout:
            sys.stdout.write(data.decode())
        print("exit", await proc.wait())


if __name__ == "__main__":
    asyncio.run(main())
