"""Cancelling a wait does not kill the process; terminate() does."""

import asyncio

from exec_server import Environment


async def main() -> None:
    async with Environment.local() as env:
        proc = await env.start(["sh", "-c", "sleep 1; echo done"])
        try:
            await asyncio.wait_for(proc.wait(), timeout=0.2)
        except asyncio.TimeoutError:
            print("still running:", proc.returncode is None)
        print("exit", await proc.wait())  # the process went on; nothing was lost
        proc = await env.start(["sleep", "60"])
        print(await proc.terminate(), await proc.wait())


if __name__ == "__main__":
    asyncio.run(main())
